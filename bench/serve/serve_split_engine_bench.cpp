// SPDX-License-Identifier: Apache-2.0
// serve_split_engine_bench: the MV-WSA policies of serve_split_bench (docs/serve_wsa.md), run on
// the real engine (CUDA or CPU) instead of the simulator: the same multi-session agentic workload
// (wsa/agentic_workload.h: sessions with a private ~1.5k prefix, several turns, each turn
// re-sending its real history -- prompt, generated tokens, new user tokens -- so the prefix cache
// can find it), `--concurrency` requests at once, routing forced per (session, position, layer)
// to the workload's calibrated routes, on a random-weight model of the Qwen3-30B-A3B layer
// widths (E 128, top-8, C 2048, F 768, 32x128 q, 4x128 kv) with `--layers` of its 48 layers.
// Budget: `--budget-gib` is the target's total on the 48-layer model; expert slots + KV blocks get
// what Qwen3-30B-A3B bf16 has left there after its dense bf16 weights and a 1 GiB workspace
// (serve_split_bench's numbers), times layers / 48 (both pools scale with the layer count).
// The engine's expert slots are bf16 on CUDA (f32 on the CPU); its KV rows are `--kv-dtype`
// (KvConfig::dtype, f32 by default: twice the bf16 KV the simulator assumes, so the KV floor takes
// twice its share; bf16: the simulator's bytes, serve_split_bench --kv-bytes 2). Every policy's
// cache, the fixed splits, the KV floor's bytes and LiveSplit's block price use that dtype's
// block bytes (run_policy refuses an engine whose cache disagrees). The CUDA engine's dense
// weights and activations are outside that pool budget (its device budget is left unlimited and
// its peak reported); LiveSplit checks expert + KV bytes <= the pool budget at every resize.
// Policies (all kv_preempt, the live engine's scheduler; same workload, model and routing):
//   fixed 50/50       half the pool budget to uniform caps, the rest KV; its run is observed by a
//                     LiveSplit that never decides (the configurator's profile)
//   expert-heavy      the largest uniform cap that leaves the KV floor
//   kv-heavy          top-k slots per layer, the rest KV
//   configurator      allocate() on the 50/50 run's curves (MV-WSA offline), then fixed
//   live              configure_auto_split (from 50/50) + LiveSplit (cadence by accesses:
//                     LiveSplitConfig::decide_accesses_per_expert, at most every
//                     decide_every_steps)
//   cap N             (--caps N,M,..) more uniform fixed splits: a partial oracle sweep
// Measured per policy: end-to-end wall time, mean/median TTFT (turn submitted -> first token
// event; a turn is submitted when its session's previous turn finishes), generated tokens / s over
// the whole run, steps, expert hit rate, preemptions, prefix-cache hit tokens, resizes, device
// peak. Ratios: x_named = best of the three named fixed splits / policy (> 1: policy faster).
//   serve_split_engine_bench [--device cuda] [--layers 2] [--vocab 18992] [--budget-gib 24]
//     [--sessions 8] [--turns 4] [--prefix 1536] [--user-max 256] [--output-max 256]
//     [--concurrency 4] [--seed 1] [--prefix-cache on] [--link-gbps 55]
//     [--policies fixed-50,expert-heavy,kv-heavy,configurator,live] [--caps 40,48]
//     [--max-policy-s 120] [--policy-s live=60,kv-heavy=40,caps=30] [--json FILE]
//     [--phase-turns 0] [--long-output-min 512] [--long-output-max 1024]
//     [--live-decide-steps 64] [--live-min-steps 4] [--live-decide-per-expert 2]
//     [--live-min-hysteresis 0.01] [--live-uniform-tie 0.01]   (the first version's controller:
//     --live-decide-per-expert 0 --live-min-hysteresis 0.05 --live-uniform-tie 0
//     --live-band-of total)
//     [--tiny]   (--tiny: a small geometry for a CPU smoke run)
//     [--scaled] [--model-step-ms 1.6 --model-miss-ms 0.197]
//     [--save-profile FILE] [--configurator-profile FILE] [--deadline-unix S] [--dense-dtype f32]
//     [--prune-slower off] [--prior-json FILE] [--host-routing] [--configurator-price-by-caps on]
//     [--live-price-by-caps off] [--kv-dtype f32|bf16] [--decode-floor auto|on|off]
// --scaled (CPU, 2 layers): the 2-layer CUDA run's split problem at 1/32 of the widths (same E,
// top-k, routing, slots, blocks, floor and modelled miss cost; see main()), so LiveSplit decides
// as it would on the GPU; its wall time is CPU compute, not a GPU's. --model-step-ms /
// --model-miss-ms price a run's own counters (steps, pager misses) with a step model, e.g. one
// fitted to an H200 run (docs/serve_wsa.md): "modelled_s" in the JSON, ratios on it printed.
// Given a step model, the LiveSplit of the profile run and of the live policy price steps by it
// too (wsa::priced_by: a miss at --model-miss-ms, a step's base at --model-step-ms, nothing per
// token), so the configurator and the controller minimise what the runs are scored on; without
// one they price a miss at expert bytes / --link-gbps and a token at LiveSplitConfig's default.
// --configurator-price-by-caps on (the default since session 30): the configurator prices a
// recomputed prompt block at each split's own caps (wsa::allocate_priced_by_caps on the profile's
// per-cap recompute misses); off: allocate() at the profile's one price. A profile without those
// curves (--configurator-profile of an older file) gets allocate() either way.
// --live-price-by-caps on: the live controller decides with that price too
// (ControllerConfig::price_by_caps; its decision time is in the JSON, live_decide_s).
// --decode-floor on (auto: on with --device cuda): the profile run's and the live policy's
// LiveSplit keep every layer's cap >= concurrency x top-k + hot (LiveSplitConfig::
// decode_on_device), so decode steps stay on the device resolver and in CUDA graphs; the
// configurator gets that floor through the profile (min_slots). The fixed splits are not raised.
// --policies also takes cap-N (a --caps run at that place in the order, e.g. the oracle's
// nearest caps before a named split that may be cut by --deadline-unix).
// --policy-s caps the wall time of policies named as in --policies ("caps": each --caps run;
// others: --max-policy-s); a policy past its cap is stopped and reported incomplete. --phase-turns:
// the phased workload variant (agentic_workload.h). x_best = the fastest complete fixed split of
// this run (named, caps and configurator: the oracle when --caps sweeps every cap) / policy. The
// live policy's JSON has every decision (live_log: step, modelled T of the held and target split,
// migration, move, applied) and the last refusal's reason.
// Split over several processes (device calls; docs/serve_wsa.md "48-layer run"): --save-profile
// writes the fixed-50 run's profile (wsa/split_profile.h, with the geometry, workload, budget and
// link it must match), --configurator-profile FILE makes the configurator use that file's
// profile instead of this process's fixed-50 run (refused if it was recorded on another
// geometry, workload, budget or link). --deadline-unix S (epoch seconds): every policy's time cap
// ends by S and a policy with < 15 s left is not started (listed in "skipped"), so the JSON --
// rewritten after every policy, and once before the first -- holds every finished policy when
// the caller's timeout comes; tools/bench/wsa_merge.py merges such runs (tokens_hash: the same
// tokens). --prune-slower on stops expert-heavy / kv-heavy once they run 2 % + 1 s past the best
// complete named split known, a --caps run past the best complete fixed split known (this process
// and --prior-json FILE, an earlier call's JSON of the same measurement): provably not the best,
// so best named / best fixed stay exact (JSON: pruned_slower, prune_at_s).
// Weights: the experts are drawn straight into one packed host store in the engine's expert
// dtype (make_builtin_moe_packed, every core) that every policy's engine reads; 48 layers take
// ~58 GB of host memory and ~2 minutes. decode_tokens_per_s: tokens generated in steps that
// computed no prompt token / those steps' wall time (generated_tokens_per_s is over the run).
// Routing (wsa/agentic_router.h): forced ahead by default -- a step's routes are asked before its
// forward pass and go up in one copy, and paged decode steps whose routed rows fit every layer's
// free slots (T*K <= cap - hot) resolve their slots on the device with one host sync per step
// (and, as CUDA graphs, replay); other steps (prefill, or caps below T*K: 50/50's 23 and
// kv-heavy's 8 slots at 4 decoding requests) take the paged host path, one routed-id read-back per
// MoE layer. --host-routing keeps the per-layer hook (a host round trip per MoE layer on top,
// every step; the runs before this flag), for an A/B. Both route identically (same tokens). Per
// policy: host_syncs (per step, and in decode-only steps), device_resolved_steps (steps whose
// every MoE layer resolved on the device), graph replays; "run": {"routing"} in the JSON, and
// --prior-json refuses a file of the other routing path.
#include <sys/utsname.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/cpu_info.h"
#include "core/process_memory.h"
#include "core/timer.h"
#include "kernels/backend.h"
#include "serve/builtin_model.h"
#include "serve/engine.h"
#include "serve/routing_trace.h"
#include "serve/wsa/agentic_router.h"
#include "serve/wsa/agentic_workload.h"
#include "serve/wsa/live_split.h"
#include "serve/wsa/split_allocator.h"
#include "serve/wsa/split_profile.h"
#include "serve/wsa/split_sim.h"

namespace {

using namespace ferry;
using namespace ferry::serve;
using namespace ferry::serve::wsa;

struct PolicyResult {
  std::string name;
  Split start;
  bool live = false, complete = false;
  double total_s = 0, mean_ttft_s = 0, median_ttft_s = 0, tokens_per_s = 0;
  std::uint64_t generated = 0, steps = 0, preemptions = 0, recompute_tokens = 0;
  std::uint64_t hits = 0, misses = 0, prefill_tokens = 0, prefix_hit_tokens = 0;
  std::uint64_t prefix_query_tokens = 0, resizes = 0, blocks_moved = 0, decisions = 0, moves = 0;
  // device_peak: the device budget's peak charge (resizable pools at their live sizes);
  // device_held_peak: the memory really held at its peak (their committed granules instead);
  // pool_reserved: the address space the pools are laid out in (their maxima).
  std::size_t device_peak = 0, pool_max_bytes = 0, device_held_peak = 0, pool_reserved = 0;
  std::vector<std::uint64_t> resize_steps;  // steps after which the pools had been resized
  std::vector<DecisionRecord> log;          // live: every decision
  std::uint64_t refused = 0;
  std::string last_refusal;
  double decide_s = 0;    // live: host time in LiveSplit's decisions (problem + decide, wall)
  double cap_s = 0;       // the time cap it ran under (its own, or what --deadline-unix left)
  double modelled_s = 0;  // --model-step-ms x steps + --model-miss-ms x misses (0: not asked)
  double started_s = 0;   // bench clock (since main started) when its engine was created
  double create_s = 0;    // Engine::create (device arenas, dense weights uploaded)
  // Steps that computed no prompt token (decode only): their wall time and generated tokens.
  std::uint64_t decode_steps = 0, decode_tokens = 0;
  double decode_s = 0;
  // The step's path (docs/serve_wsa.md "48-layer run"): host waits (Engine::host_syncs: the
  // runner's one per step, the per-layer routing hook's, the paged host path's routed-id
  // read-backs), in all and in decode-only steps; steps whose every MoE layer resolved its slots
  // on the device (ExecutorCounters::device_resolved grew by the MoE layer count), the layer calls
  // so resolved, and the CUDA graph counters (zeros on the CPU).
  std::uint64_t host_syncs = 0, decode_host_syncs = 0;
  std::uint64_t device_resolved_steps = 0, device_resolved_calls = 0;
  GraphStats graphs;
  std::string profile_source;  // configurator: where its profile came from
  // --prune-slower: the time after which this fixed split is provably slower than a complete
  // one (0: not pruned); set when the run was stopped there.
  double prune_at_s = 0;
  bool pruned = false;
  Split final_split;
  std::map<std::pair<int, int>, std::vector<std::int32_t>> tokens;
  std::string error;
};

nlohmann::json split_json(const Split& s) {
  return {{"slots", s.slots}, {"kv_blocks", s.kv_blocks}, {"text", to_string(s)}};
}

struct Setup {
  const BuiltinModel* model = nullptr;
  const AgenticWorkload* w = nullptr;
  kernels::Backend* backend = nullptr;
  DType expert_dtype = DType::kF32;
  std::size_t pool_budget = 0, kv_block_bytes = 0;
  int block_tokens = 16, concurrency = 4, max_batch_tokens = 512, floor_blocks = 0;
  bool prefix_cache = true;
  double link_bytes_per_s = 55e9;
  double max_policy_s = 120;
  std::map<std::string, double> policy_s;  // per-policy time caps (--policy-s), else max_policy_s
  // live: LiveSplitConfig's cadence (--live-decide-steps, --live-min-steps,
  // --live-decide-per-expert)
  int decide_every_steps = 64, min_decide_steps = 4;
  double decide_per_expert = 2;
  double min_hysteresis = 0.01, uniform_tie = 0.01;  // --live-min-hysteresis, --live-uniform-tie
  bool band_of_avoidable = true;                     // --live-band-of avoidable|total
  bool live_price_by_caps = false;                   // --live-price-by-caps on|off
  // --decode-floor on|off (default: on with --device cuda): LiveSplitConfig::decode_on_device,
  // for the profile run (so the configurator's problem too) and the live policy.
  bool decode_floor = false;
  double model_step_s = 0, model_miss_s = 0;  // --model-step-ms, --model-miss-ms
  // The step model that scores the runs (nothing per token), which LiveSplit then prices by.
  bool priced_by_model() const { return model_step_s > 0 || model_miss_s > 0; }
  StepModel step_model() const { return {.step_s = model_step_s, .miss_s = model_miss_s}; }
  const ExpertStore* host_store = nullptr;  // the packed experts every engine reads (one copy)
  DType dense_dtype = DType::kF32;          // --dense-dtype
  DType kv_dtype = DType::kF32;             // --kv-dtype: every policy's KvConfig::dtype
  double deadline_unix = 0;                 // --deadline-unix: no policy runs past it (0: none)
  bool host_routing = false;  // --host-routing: the per-layer routing hook (no forcing ahead)
  const ferry::Timer* bench_clock = nullptr;
};

double now_unix_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One engine, one policy: fixed at `start`, or (live) configure_auto_split + LiveSplit. With
// `profile`, a fixed run is observed by a LiveSplit that never decides and its curves returned.
PolicyResult run_policy(const Setup& su, const std::string& key, const std::string& name,
                        const Split& start, bool live, SplitProblem* profile,
                        double prune_at_s = 0) {
  PolicyResult pr{.name = name, .start = start, .live = live, .prune_at_s = prune_at_s};
  const model::DecoderGeometry& geo = su.model->geometry;
  EngineConfig ec;
  ec.max_running = su.concurrency;
  ec.max_batch_tokens = su.max_batch_tokens;
  ec.kv.block_tokens = su.block_tokens;
  ec.kv.prefix_cache = su.prefix_cache;
  ec.kv.dtype = su.kv_dtype;  // before configure_auto_split: it sizes blocks by it
  ec.pager.expert_dtype = su.expert_dtype;
  ec.pager.link_gbps = su.link_bytes_per_s / 1e9;
  if (live) {
    if (Status st = configure_auto_split(geo, su.pool_budget, su.floor_blocks, ec); !st.ok()) {
      pr.error = st.to_string();
      return pr;
    }
  } else {
    ec.pager.mode = ExpertMode::kPaged;
    ec.pager.layer_slots.assign(std::size_t(geo.layers), 0);
    for (int l = 0; l < geo.layers; ++l) ec.pager.layer_slots[std::size_t(l)] = start.slots[l];
    ec.kv.budget_bytes = std::size_t(start.kv_blocks) * su.kv_block_bytes;
    ec.kv_preempt = true;
    if (profile != nullptr) {  // resizable so a LiveSplit can attach; it never resizes
      ec.pager.resizable = true;
      ec.kv.max_budget_bytes = su.pool_budget;
    }
  }
  ec.device_budget_bytes = 0;  // dense weights + activations sit outside the pool budget
  ec.dense_dtype = su.dense_dtype;
  ec.pager.host_store = su.host_store;  // null: the engine packs its own copy
  if (su.bench_clock != nullptr) pr.started_s = su.bench_clock->elapsed_s();
  ferry::Timer create_clock;
  auto eng_r = Engine::create(geo, su.model->params, ec, *su.backend);
  pr.create_s = create_clock.elapsed_s();
  if (!eng_r.ok()) {
    pr.error = eng_r.status().to_string();
    return pr;
  }
  Engine& eng = **eng_r;
  // The fixed splits, the floor's bytes and the profile were sized with su.kv_block_bytes: a
  // cache of other blocks would run another split than the one reported.
  if (eng.kv().block_bytes() != su.kv_block_bytes) {
    pr.error = internal_error(
                   "bench: the engine's kv block is {} bytes, the split was planned "
                   "with {}",
                   eng.kv().block_bytes(), su.kv_block_bytes)
                   .to_string();
    return pr;
  }
  std::unique_ptr<LiveSplit> ls;
  if (live || profile != nullptr) {
    LiveSplitConfig lc{.budget_bytes = su.pool_budget,
                       .concurrency = su.concurrency,
                       .max_context_tokens = su.w->max_context(),
                       .decide_every_steps = live ? su.decide_every_steps : (1 << 30),
                       .min_decide_steps = su.min_decide_steps,
                       .decide_accesses_per_expert = live ? su.decide_per_expert : 0.0,
                       .link_bytes_per_s = su.link_bytes_per_s,
                       .controller = {.min_hysteresis = su.min_hysteresis,
                                      .uniform_tie = su.uniform_tie,
                                      .of_avoidable = su.band_of_avoidable,
                                      .price_by_caps = su.live_price_by_caps}};
    lc.decode_on_device = su.decode_floor;
    // With a step model the runs are scored by it, so LiveSplit prices by it too: its profile
    // (the configurator's input) and the live controller's problems. Without one: the link and
    // LiveSplitConfig's default prefill_token_s, as before.
    if (su.priced_by_model()) {
      lc = priced_by(lc, su.step_model(), eng.experts().store()->expert_bytes());
    }
    auto r = LiveSplit::attach(eng, lc);
    if (!r.ok()) {
      pr.error = r.status().to_string();
      return pr;
    }
    ls = std::move(*r);
  }
  const AgenticWorkload& w = *su.w;
  // Forced ahead (the default): one upload of the step's routes, paged decode steps resolve
  // their slots on the device; --host-routing: the per-layer hook (a host round trip per layer).
  AgenticRouter router(w, /*ahead=*/!su.host_routing);
  eng.set_routing_hook(&router);
  int moe_layers = 0;
  for (int l = 0; l < geo.layers; ++l) moe_layers += geo.layer_is_moe[std::size_t(l)] ? 1 : 0;
  const int vocab = geo.vocab;
  std::map<RequestId, std::pair<int, int>> turn_of;
  std::map<int, std::vector<std::int32_t>> prompt_of;
  std::map<RequestId, double> submitted;
  std::vector<double> ttft;
  const auto cap_it = su.policy_s.find(key);
  pr.cap_s = cap_it != su.policy_s.end() ? cap_it->second : su.max_policy_s;
  if (su.deadline_unix > 0) pr.cap_s = std::min(pr.cap_s, su.deadline_unix - now_unix_s());
  ferry::Timer clock;
  double next_progress_s = 30;
  Status failed = ok_status();
  auto submit = [&](int s, int t, std::vector<std::int32_t> prompt) {
    prompt_of[s] = prompt;
    auto id = eng.submit(
        {.prompt = std::move(prompt), .max_new_tokens = w.turns(s)[std::size_t(t)].output});
    if (!id.ok()) {
      failed = id.status();
      return;
    }
    turn_of[*id] = {s, t};
    router.bind(*id, s);
    submitted[*id] = clock.elapsed_s();
  };
  for (int s = 0; s < w.sessions(); ++s) submit(s, 0, w.turn_prompt(s, 0, vocab));
  while (failed.ok() && !eng.idle()) {
    if (clock.elapsed_s() > std::min(pr.cap_s, pr.prune_at_s > 0 ? pr.prune_at_s : pr.cap_s)) {
      if (pr.prune_at_s > 0 && pr.prune_at_s <= pr.cap_s) {
        pr.pruned = true;
        failed = deadline_exceeded(
            "bench: {} stopped at {:.1f} s: slower than a complete split of this measurement "
            "(--prune-slower)",
            name, pr.prune_at_s);
      } else {
        failed = deadline_exceeded("bench: {} ran past its time cap of {} s", name, pr.cap_s);
      }
      break;
    }
    const std::uint64_t resizes = eng.stats().pool_resizes;
    const std::uint64_t prefilled = eng.stats().prefill_tokens;
    const std::uint64_t syncs = eng.host_syncs();
    const std::uint64_t resolved = eng.experts().counters().device_resolved;
    const double step_t0 = clock.elapsed_s();
    auto ev = eng.step();
    if (!ev.ok()) {
      failed = ev.status();
      break;
    }
    if (eng.stats().pool_resizes != resizes) pr.resize_steps.push_back(eng.stats().steps);
    const double now = clock.elapsed_s();
    if (eng.stats().prefill_tokens == prefilled) {  // a decode-only step
      ++pr.decode_steps;
      pr.decode_tokens += ev->size();
      pr.decode_s += now - step_t0;
      pr.decode_host_syncs += eng.host_syncs() - syncs;
    }
    if (moe_layers > 0 &&
        eng.experts().counters().device_resolved - resolved == std::uint64_t(moe_layers)) {
      ++pr.device_resolved_steps;
    }
    if (now >= next_progress_s) {  // a 48-layer policy runs minutes: show where it is
      next_progress_s += 30;
      std::printf("  [%s %.0f s] step %llu, %llu tokens generated, %llu expert misses\n",
                  name.c_str(), now, static_cast<unsigned long long>(eng.stats().steps),
                  static_cast<unsigned long long>(pr.generated + ev->size()),
                  static_cast<unsigned long long>(eng.experts().pager()->counters().misses));
      std::fflush(stdout);
    }
    for (const TokenEvent& e : *ev) {
      if (e.index == 0 && e.token >= 0) ttft.push_back(now - submitted.at(e.id));
      ++pr.generated;
      if (e.finish == FinishReason::kNone) continue;
      if (e.finish != FinishReason::kLength) {
        failed = internal_error("bench: request {} finished by {}", e.id, to_string(e.finish));
        break;
      }
      auto o = eng.take_output(e.id);
      if (!o.ok()) {
        failed = o.status();
        break;
      }
      const auto [s, t] = turn_of.at(e.id);
      pr.tokens[{s, t}] = o->tokens;
      if (t + 1 >= static_cast<int>(w.turns(s).size())) continue;
      submit(s, t + 1, w.next_turn_prompt(s, t, prompt_of[s], o->tokens, vocab));
    }
  }
  pr.total_s = clock.elapsed_s();
  pr.complete = failed.ok();
  if (!failed.ok()) pr.error = failed.to_string();
  eng.set_routing_hook(nullptr);
  if (!ttft.empty()) {
    double sum = 0;
    for (double x : ttft) sum += x;
    pr.mean_ttft_s = sum / double(ttft.size());
    std::sort(ttft.begin(), ttft.end());
    pr.median_ttft_s = ttft[ttft.size() / 2];
  }
  pr.tokens_per_s = pr.total_s > 0 ? double(pr.generated) / pr.total_s : 0;
  const EngineStats& st = eng.stats();
  pr.steps = st.steps;
  pr.preemptions = st.preemptions;
  pr.recompute_tokens = st.recompute_tokens;
  pr.prefill_tokens = st.prefill_tokens;
  pr.prefix_hit_tokens = st.prefix_hit_tokens;
  pr.prefix_query_tokens = st.prefix_query_tokens;
  pr.resizes = st.pool_resizes;
  pr.blocks_moved = eng.kv().blocks_moved();
  pr.host_syncs = eng.host_syncs();
  pr.device_resolved_calls = eng.experts().counters().device_resolved;
  pr.graphs = eng.graph_stats();
  const PagerCounters& pc = eng.experts().pager()->counters();
  pr.hits = pc.hits;
  pr.misses = pc.misses;
  pr.modelled_s = su.model_step_s * double(pr.steps) + su.model_miss_s * double(pr.misses);
  pr.device_peak = eng.device_budget().bytes_peak();
  pr.device_held_peak = eng.device_held_peak_bytes();
  pr.pool_reserved = eng.pool_reserved_bytes();
  pr.final_split.kv_blocks = eng.kv().num_blocks();
  for (int l = 0; l < geo.layers; ++l) {
    pr.final_split.slots.push_back(eng.experts().pager()->capacity(l));
  }
  pr.pool_max_bytes = pr.final_split.bytes(
      {.expert_bytes = eng.experts().store()->expert_bytes(), .kv_block_bytes = su.kv_block_bytes});
  if (ls) {
    pr.decisions = ls->stats().decisions;
    pr.decide_s = ls->stats().decide_s;
    pr.moves = ls->stats().moves;
    pr.pool_max_bytes = std::max(pr.pool_max_bytes, ls->stats().max_bytes);
    if (live) {
      pr.log = ls->stats().log;
      pr.refused = ls->stats().refused;
      pr.last_refusal = ls->stats().last_refusal;
    }
    if (profile != nullptr) *profile = ls->problem(eng);
  }
  return pr;
}

// Every live decision: step, modelled T of the held split and of the target (ms), migration
// (ms), whether the controller asked to move and whether the pools were resized.
nlohmann::json log_json(const std::vector<DecisionRecord>& log) {
  nlohmann::json a = nlohmann::json::array();
  for (const DecisionRecord& d : log) {
    a.push_back({{"step", d.step},
                 {"current_ms", d.current_s * 1e3},
                 {"target_ms", d.target_s * 1e3},
                 {"migration_ms", d.migration_s * 1e3},
                 {"move", d.move},
                 {"applied", d.applied},
                 {"target", to_string(d.target)}});
  }
  return a;
}

// FNV-1a over every turn's generated tokens in (session, turn) order: lets tools/bench/wsa_merge.py
// check that runs in different processes (device calls) generated the same tokens.
std::string tokens_hash(const std::map<std::pair<int, int>, std::vector<std::int32_t>>& tokens) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const auto& [turn, toks] : tokens) {
    const std::int32_t key[3] = {turn.first, turn.second, static_cast<std::int32_t>(toks.size())};
    mix(key, sizeof key);
    mix(toks.data(), toks.size() * sizeof(std::int32_t));
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

nlohmann::json result_json(const PolicyResult& r, double named_s) {
  const std::uint64_t acc = r.hits + r.misses;
  return {{"policy", r.name},
          {"complete", r.complete},
          {"error", r.error},
          {"live", r.live},
          {"start_split", split_json(r.start)},
          {"final_split", split_json(r.final_split)},
          {"total_s", r.total_s},
          {"mean_ttft_s", r.mean_ttft_s},
          {"median_ttft_s", r.median_ttft_s},
          {"generated_tokens", r.generated},
          {"generated_tokens_per_s", r.tokens_per_s},
          {"decode_steps", r.decode_steps},
          {"decode_step_s", r.decode_s},
          {"decode_tokens", r.decode_tokens},
          {"decode_tokens_per_s", r.decode_s > 0 ? double(r.decode_tokens) / r.decode_s : 0.0},
          {"host_syncs", r.host_syncs},
          {"host_syncs_per_step", r.steps > 0 ? double(r.host_syncs) / double(r.steps) : 0.0},
          {"decode_host_syncs", r.decode_host_syncs},
          {"decode_host_syncs_per_step",
           r.decode_steps > 0 ? double(r.decode_host_syncs) / double(r.decode_steps) : 0.0},
          {"device_resolved_steps", r.device_resolved_steps},
          {"device_resolved_layer_calls", r.device_resolved_calls},
          {"graph_eligible_steps", r.graphs.eligible_steps},
          {"graph_replays", r.graphs.replays},
          {"graph_disabled_reason", r.graphs.disabled_reason},
          {"turns_finished", r.tokens.size()},
          {"tokens_hash", tokens_hash(r.tokens)},
          {"steps", r.steps},
          {"expert_hit_rate", acc ? double(r.hits) / double(acc) : 0.0},
          {"expert_misses", r.misses},
          {"prefill_tokens", r.prefill_tokens},
          {"prefix_hit_tokens", r.prefix_hit_tokens},
          {"prefix_query_tokens", r.prefix_query_tokens},
          {"preemptions", r.preemptions},
          {"recompute_tokens", r.recompute_tokens},
          {"pool_resizes", r.resizes},
          {"kv_blocks_moved", r.blocks_moved},
          {"live_decisions", r.decisions},
          {"live_moves", r.moves},
          {"resize_steps", r.resize_steps},
          {"live_refused", r.refused},
          {"live_last_refusal", r.last_refusal},
          {"live_log", log_json(r.log)},
          {"live_decide_s", r.decide_s},
          {"cap_s", r.cap_s},
          {"started_s", r.started_s},
          {"engine_create_s", r.create_s},
          {"profile_source", r.profile_source},
          {"prune_at_s", r.prune_at_s},
          {"pruned_slower", r.pruned},
          {"modelled_s", r.modelled_s},
          {"pool_max_bytes", r.pool_max_bytes},
          {"device_peak_bytes", r.device_peak},
          {"device_held_peak_bytes", r.device_held_peak},
          {"pool_reserved_bytes", r.pool_reserved},
          {"x_named", named_s > 0 && r.complete && r.total_s > 0 ? named_s / r.total_s : 0.0}};
}

// What two bench JSON files must share to be one measurement (tools/bench/wsa_merge.py checks
// the same): geometry (less build figures), workload, pool budget, KV floor, link.
nlohmann::json problem_key_of(const nlohmann::json& doc) {
  nlohmann::json geo = doc.value("geometry", nlohmann::json::object());
  for (const char* k :
       {"model_build_s", "host_peak_rss_bytes_after_build", "dense_dtype", "host_bytes_estimate"}) {
    geo.erase(k);
  }
  const nlohmann::json budget = doc.value("budget", nlohmann::json::object());
  const nlohmann::json run = doc.value("run", nlohmann::json::object());
  // The routing path changes every step's cost, so a prior of the other path cannot bound
  // --prune-slower; files without the field ran the per-layer hook (before forced-ahead routing).
  return {{"geometry", geo},
          {"workload", doc.value("workload", nlohmann::json::object())},
          {"pool_budget_bytes", budget.value("pool_budget_bytes", nlohmann::json())},
          {"kv_floor_blocks", budget.value("kv_floor_blocks", nlohmann::json())},
          {"link_gbps", run.value("link_gbps", nlohmann::json())},
          {"routing", run.value("routing", std::string("per-layer"))}};
}

// MemAvailable of /proc/meminfo in bytes, 0 if unknown.
std::size_t host_memory_available_bytes() {
  std::ifstream f("/proc/meminfo");
  for (std::string line; std::getline(f, line);) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) return kib * 1024;
  }
  return 0;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) {
    if (!x.empty()) out.push_back(x);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cuda", json_path,
              policies_arg =
                  "fixed-50,expert-heavy,kv-heavy,"
                  "configurator,live";
  std::string caps_arg;
  int layers = 2, vocab = 18992, sessions = 8, turns = 4, prefix = 1536, user_max = 256;
  int output_max = 256, concurrency = 4;
  double budget_gib = 24, link_gbps = 55, max_policy_s = 120;
  int phase_turns = 0, long_output_min = 512, long_output_max = 1024;
  int decide_steps = 64, min_steps = 4;
  double decide_per_expert = 2, min_hysteresis = 0.01, uniform_tie = 0.01;
  bool band_of_avoidable = true;
  bool live_price_by_caps = false;
  std::string decode_floor_arg = "auto";
  std::string policy_s_arg;
  std::uint64_t seed = 1;
  bool prefix_cache = true, tiny = false, scaled = false, host_routing = false;
  double model_step_ms = 0, model_miss_ms = 0;
  std::string save_profile_path, load_profile_path, prior_json_path;
  bool prune_slower = false;
  bool price_by_caps = true;  // --configurator-price-by-caps on|off (on since session 30)
  double deadline_unix = 0;
  DType dense_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;  // --kv-dtype f32|bf16
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tiny") {
      tiny = true;
      continue;
    }
    if (a == "--scaled") {
      scaled = true;
      continue;
    }
    if (a == "--host-routing") {
      host_routing = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "serve_split_engine_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    const char* v = argv[++i];
    if (a == "--device")
      device = v;
    else if (a == "--layers")
      layers = std::atoi(v);
    else if (a == "--vocab")
      vocab = std::atoi(v);
    else if (a == "--budget-gib")
      budget_gib = std::atof(v);
    else if (a == "--sessions")
      sessions = std::atoi(v);
    else if (a == "--turns")
      turns = std::atoi(v);
    else if (a == "--prefix")
      prefix = std::atoi(v);
    else if (a == "--user-max")
      user_max = std::atoi(v);
    else if (a == "--output-max")
      output_max = std::atoi(v);
    else if (a == "--concurrency")
      concurrency = std::atoi(v);
    else if (a == "--seed")
      seed = std::strtoull(v, nullptr, 10);
    else if (a == "--prefix-cache")
      prefix_cache = std::strcmp(v, "off") != 0;
    else if (a == "--link-gbps")
      link_gbps = std::atof(v);
    else if (a == "--policies")
      policies_arg = v;
    else if (a == "--caps")
      caps_arg = v;
    else if (a == "--max-policy-s")
      max_policy_s = std::atof(v);
    else if (a == "--policy-s")
      policy_s_arg = v;
    else if (a == "--phase-turns")
      phase_turns = std::atoi(v);
    else if (a == "--long-output-min")
      long_output_min = std::atoi(v);
    else if (a == "--long-output-max")
      long_output_max = std::atoi(v);
    else if (a == "--live-decide-steps")
      decide_steps = std::atoi(v);
    else if (a == "--live-min-steps")
      min_steps = std::atoi(v);
    else if (a == "--live-min-hysteresis")
      min_hysteresis = std::atof(v);
    else if (a == "--live-band-of")
      band_of_avoidable = std::strcmp(v, "total") != 0;
    else if (a == "--live-price-by-caps")
      live_price_by_caps = std::strcmp(v, "off") != 0;
    else if (a == "--decode-floor")
      decode_floor_arg = v;
    else if (a == "--live-uniform-tie")
      uniform_tie = std::atof(v);
    else if (a == "--live-decide-per-expert")
      decide_per_expert = std::atof(v);
    else if (a == "--json")
      json_path = v;
    else if (a == "--model-step-ms")
      model_step_ms = std::atof(v);
    else if (a == "--model-miss-ms")
      model_miss_ms = std::atof(v);
    else if (a == "--save-profile")
      save_profile_path = v;
    else if (a == "--configurator-profile")
      load_profile_path = v;
    else if (a == "--deadline-unix")
      deadline_unix = std::atof(v);
    else if (a == "--prior-json")
      prior_json_path = v;
    else if (a == "--configurator-price-by-caps")
      price_by_caps = std::strcmp(v, "off") != 0;
    else if (a == "--prune-slower")
      prune_slower = std::strcmp(v, "off") != 0;
    else if (a == "--dense-dtype") {
      auto d = parse_dense_dtype(v);
      if (!d.ok()) {
        std::fprintf(stderr, "serve_split_engine_bench: %s\n", d.status().to_string().c_str());
        return 2;
      }
      dense_dtype = *d;
    } else if (a == "--kv-dtype") {
      auto d = parse_kv_dtype(v);  // the ferry CLI's parser (serve_config.h)
      if (!d.ok()) {
        std::fprintf(stderr, "serve_split_engine_bench: %s\n", d.status().to_string().c_str());
        return 2;
      }
      kv_dtype = *d;
    } else {
      std::fprintf(stderr, "serve_split_engine_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  for (const std::string& p : split_list(policies_arg)) {
    const bool cap_entry = p.rfind("cap-", 0) == 0 && std::atoi(p.c_str() + 4) > 0;
    if (p != "fixed-50" && p != "expert-heavy" && p != "kv-heavy" && p != "configurator" &&
        p != "live" && !cap_entry) {
      std::fprintf(stderr, "serve_split_engine_bench: unknown policy %s\n", p.c_str());
      return 2;
    }
  }
  if (deadline_unix > 0 && deadline_unix < now_unix_s()) {
    std::fprintf(stderr, "serve_split_engine_bench: --deadline-unix %.0f has passed\n",
                 deadline_unix);
    return 2;
  }
  // The target: Qwen3-30B-A3B bf16 on 48 layers (serve_split_bench's accounting).
  constexpr int kLayers = 48, kExperts = 128, kTopK = 8, kHidden = 2048, kExpertWidth = 768;
  constexpr int kHeads = 32, kKvHeads = 4, kHeadDim = 128, kVocab = 151936;
  const std::size_t attn =
      std::size_t(kHidden) * kHeads * kHeadDim * 2 + std::size_t(kHidden) * kKvHeads * kHeadDim * 2;
  const std::size_t dense_bytes =
      2 * (2ull * kVocab * kHidden + kLayers * (attn + std::size_t(kHidden) * kExperts));
  const std::size_t workspace_bytes = 1ull << 30;
  const std::size_t total = std::size_t(budget_gib * double(1ull << 30));
  FERRY_CHECK(total > dense_bytes + workspace_bytes, "budget {} GiB below the dense weights",
              budget_gib);
  BuiltinMoeSpec spec{.vocab = vocab,
                      .layers = layers,
                      .hidden = kHidden,
                      .heads = kHeads,
                      .kv_heads = kKvHeads,
                      .head_dim = kHeadDim,
                      .experts = kExperts,
                      .top_k = kTopK,
                      .expert_width = kExpertWidth,
                      .max_positions = 8192,
                      .parallel_init = true};
  std::size_t pool_budget =
      std::size_t(double(total - dense_bytes - workspace_bytes) * double(layers) / kLayers);
  if (tiny) {  // CPU smoke: a small geometry, the same budget share per layer of its experts
    spec = {.vocab = 512,
            .layers = layers,
            .hidden = 64,
            .heads = 4,
            .kv_heads = 2,
            .head_dim = 16,
            .experts = 32,
            .top_k = 4,
            .expert_width = 32,
            .max_positions = 8192,
            .parallel_init = true};
  }
  // --scaled (CPU): the target's routing geometry (E 128, top-8) at 1/32 of its widths, sized so
  // that the split problem is the CUDA run's: an f32 expert of 3 x 256 x 96 x 4 = 294,912 bytes
  // is 1/32 of the bf16 9.44 MB one, a 2-layer f32 KV block (1 kv head x 16) 4,096 bytes = 1/32
  // of the 16 x 4 x 128 x 4 x 2 x 2 one (with --kv-dtype bf16 both halve: 2,048 = 1/32 of
  // 65,536); the pool budget and the link are divided by 32 too, so slots, blocks, the floor and
  // a miss's modelled cost (bytes / link) are the GPU run's.
  constexpr double kScale = 32;
  if (scaled) {
    FERRY_CHECK(!tiny && device == "cpu" && layers == 2, "--scaled is a 2-layer CPU geometry");
    spec = {.vocab = 2048,
            .layers = layers,
            .hidden = kHidden / 8,
            .heads = 4,
            .kv_heads = 1,
            .head_dim = 16,
            .experts = kExperts,
            .top_k = kTopK,
            .expert_width = kExpertWidth / 8,
            .max_positions = 8192,
            .parallel_init = true};
    pool_budget = std::size_t(double(pool_budget) / kScale);
    link_gbps /= kScale;
  }
  const bool cuda = device == "cuda";
  kernels::Backend* backend = &kernels::cpu_backend();
  if (cuda) {
    auto be = kernels::cuda_backend(0);
    if (!be.ok()) {
      std::fprintf(stderr, "serve_split_engine_bench: %s\n", be.status().to_string().c_str());
      return 1;
    }
    backend = *be;
  }
  ferry::Timer bench_clock;
  // Everything below up to the model build needs only the spec: a bad flag or a profile of
  // another run is refused before minutes of weight drawing (48 layers: ~2 minutes).
  const DType edt = cuda ? DType::kBF16 : DType::kF32;
  const std::size_t expert_bytes =
      3 * std::size_t(spec.hidden) * std::size_t(spec.expert_width) * dtype_size(edt);
  const AgenticWorkload w({.sessions = sessions,
                           .turns = turns,
                           .prefix_tokens = prefix,
                           .user_max = user_max,
                           .output_max = output_max,
                           .phase_turns = phase_turns,
                           .long_output_min = long_output_min,
                           .long_output_max = long_output_max,
                           .moe_layers = spec.layers,
                           .experts = spec.experts,
                           .top_k = spec.top_k,
                           .seed = seed});
  Setup su{.w = &w,
           .backend = backend,
           .expert_dtype = edt,
           .pool_budget = pool_budget,
           .concurrency = concurrency,
           .prefix_cache = prefix_cache,
           .link_bytes_per_s = link_gbps * 1e9,
           .max_policy_s = max_policy_s,
           .decide_every_steps = decide_steps,
           .min_decide_steps = min_steps,
           .decide_per_expert = decide_per_expert,
           .min_hysteresis = min_hysteresis,
           .uniform_tie = uniform_tie,
           .band_of_avoidable = band_of_avoidable,
           .live_price_by_caps = live_price_by_caps,
           .decode_floor = decode_floor_arg == "auto" ? cuda : decode_floor_arg != "off",
           .model_step_s = model_step_ms * 1e-3,
           .model_miss_s = model_miss_ms * 1e-3,
           .dense_dtype = dense_dtype,
           .kv_dtype = kv_dtype,
           .deadline_unix = deadline_unix,
           .host_routing = host_routing,
           .bench_clock = &bench_clock};
  // --policy-s live=60,caps=30: a time cap per --policies name ("caps": each --caps run), others
  // get --max-policy-s.
  for (const std::string& kv : split_list(policy_s_arg)) {
    const std::size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "serve_split_engine_bench: --policy-s wants name=s, got %s\n",
                   kv.c_str());
      return 2;
    }
    su.policy_s[kv.substr(0, eq)] = std::atof(kv.c_str() + eq + 1);
  }
  // KvCache::block_bytes() of this geometry and dtype (run_policy checks each engine's).
  su.kv_block_bytes = std::size_t(spec.layers) * 2 * std::size_t(su.block_tokens) *
                      std::size_t(spec.kv_heads) * std::size_t(spec.head_dim) *
                      dtype_size(kv_dtype);
  su.floor_blocks = concurrency * ((w.max_context() + su.block_tokens - 1) / su.block_tokens);
  if (tiny) {
    // 40 % of the experts' bytes (the share 24 GiB leaves them on the target) + 1.5x the floor.
    su.pool_budget = std::size_t(0.4 * double(expert_bytes) * spec.experts * spec.layers) +
                     std::size_t(1.5 * su.floor_blocks) * su.kv_block_bytes;
    pool_budget = su.pool_budget;
  }
  // The fixed splits come from the simulator's problem skeleton with the engine's sizes.
  SimConfig sc;
  sc.expert_bytes = expert_bytes;
  sc.kv_bytes_per_token = su.kv_block_bytes / std::size_t(su.block_tokens);
  sc.block_tokens = su.block_tokens;
  sc.budget_bytes = pool_budget;
  sc.max_running = concurrency;
  sc.kv_floor_blocks = su.floor_blocks;
  sc.link_bytes_per_s = su.link_bytes_per_s;
  const SplitProblem skel = sim_problem(sc, spec.layers, spec.experts, spec.top_k);
  auto half = fraction_split(skel, 0.5);
  FERRY_CHECK(half.ok(), "50/50: {}", half.status().to_string());
  const std::vector<Split> uniform = all_uniform_splits(skel);
  FERRY_CHECK(!uniform.empty(), "no uniform split fits the pool budget");

  utsname un{};
  uname(&un);
  nlohmann::json out;
  out["what"] =
      "MV-WSA split policies on the real serving engine: agentic workload, forced calibrated "
      "routing, random-weight Qwen3-30B-A3B layer widths";
  out["machine"] = {{"host", un.nodename}, {"cpu", ferry::cpu_model_name()}, {"device", device}};
  out["geometry"] = {{"layers", spec.layers},
                     {"of_target_layers", kLayers},
                     {"hidden", spec.hidden},
                     {"experts", spec.experts},
                     {"top_k", spec.top_k},
                     {"expert_width", spec.expert_width},
                     {"vocab", spec.vocab},
                     {"tiny", tiny},
                     {"scaled", scaled},
                     {"expert_dtype", std::string(to_string(edt))},
                     {"dense_dtype", std::string(to_string(dense_dtype))},
                     {"expert_bytes", expert_bytes},
                     {"kv_block_bytes", su.kv_block_bytes}};
  out["budget"] = {{"target_total_gib", budget_gib},
                   {"target_dense_bf16_bytes", dense_bytes},
                   {"target_workspace_bytes", workspace_bytes},
                   {"pool_budget_bytes", pool_budget},
                   {"kv_floor_blocks", su.floor_blocks},
                   {"note",
                    "pool budget = (total - dense - workspace) x layers / 48; dense weights and "
                    "activations of this engine are outside it (device budget unlimited)"}};
  out["workload"] = {{"sessions", sessions},
                     {"turns", turns},
                     {"prefix_tokens", prefix},
                     {"user_max", user_max},
                     {"output_max", output_max},
                     {"concurrency", concurrency},
                     {"max_context", w.max_context()},
                     {"seed", seed},
                     {"prefix_cache", prefix_cache},
                     {"max_batch_tokens", su.max_batch_tokens},
                     {"block_tokens", su.block_tokens},
                     {"phase_turns", phase_turns},
                     {"long_output_min", long_output_min},
                     {"long_output_max", long_output_max}};
  out["live"] = {{"decide_every_steps", decide_steps},
                 {"min_decide_steps", min_steps},
                 {"decide_accesses_per_expert", decide_per_expert},
                 {"min_hysteresis", min_hysteresis},
                 {"uniform_tie", uniform_tie},
                 {"band_of_avoidable", band_of_avoidable}};
  out["run"] = {{"deadline_unix", deadline_unix},
                {"link_gbps", link_gbps},
                {"prune_slower", prune_slower},
                {"prior_json", prior_json_path},
                {"save_profile", save_profile_path},
                {"configurator_profile", load_profile_path},
                {"routing", host_routing ? "per-layer" : "forced-ahead"},
                {"live_split_prices", su.priced_by_model() ? "step model" : "link"},
                {"configurator_price_by_caps", price_by_caps},
                {"live_price_by_caps", live_price_by_caps},
                {"decode_floor", su.decode_floor},
                {"model_step_ms", model_step_ms},
                {"model_miss_ms", model_miss_ms},
                {"kv_dtype", std::string(to_string(kv_dtype))}};
  // What a saved profile must match to be used by another run's configurator: the split
  // problem's sizes, costs and workload (tools/bench/wsa_merge.py merges such runs' JSON).
  nlohmann::json profile_key = {{"geometry", out["geometry"]},
                                {"workload", out["workload"]},
                                {"pool_budget_bytes", pool_budget},
                                {"kv_floor_blocks", su.floor_blocks},
                                {"link_gbps", link_gbps}};
  profile_key["geometry"].erase("dense_dtype");  // the split problem does not depend on it
  // A profile priced by a step model (its miss and prefix-block costs) matches only that model;
  // without one the key is as before (profiles saved before the step model priced LiveSplit).
  if (su.priced_by_model()) {
    profile_key["step_model"] = {{"step_ms", model_step_ms}, {"miss_ms", model_miss_ms}};
  }

  // --prior-json: an earlier call's JSON of the same measurement; its best complete named and
  // fixed times bound --prune-slower from the first policy on.
  double prior_named_s = 0, prior_fixed_s = 0;
  if (!prior_json_path.empty()) {
    std::ifstream f(prior_json_path);
    const nlohmann::json prior = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (!f || prior.is_discarded() || !prior.is_object()) {
      std::fprintf(stderr, "serve_split_engine_bench: cannot read --prior-json %s\n",
                   prior_json_path.c_str());
      return 2;
    }
    if (problem_key_of(prior) != problem_key_of(out)) {
      std::fprintf(stderr,
                   "serve_split_engine_bench: --prior-json %s is another measurement:\n  its key  "
                   "%s\n  this run %s\n",
                   prior_json_path.c_str(), problem_key_of(prior).dump().c_str(),
                   problem_key_of(out).dump().c_str());
      return 2;
    }
    prior_named_s = prior.value("best_named_fixed_s", 0.0);
    prior_fixed_s = prior.value("best_fixed_s", 0.0);
    std::printf("prior call %s: best named fixed %.2f s, best fixed %.2f s\n",
                prior_json_path.c_str(), prior_named_s, prior_fixed_s);
  }
  out["run"]["prior_best_named_fixed_s"] = prior_named_s;
  out["run"]["prior_best_fixed_s"] = prior_fixed_s;

  std::vector<PolicyResult> results;
  // --prune-slower: a named split (expert-heavy, kv-heavy) is stopped once it has run 2 % + 1 s
  // longer than the best complete named split known (this process or --prior-json), a cap once
  // longer than the best complete fixed split known: it is then provably not the best of its
  // kind, so best named, best fixed, x_named and x_best are exactly what a full run gives, and
  // the time goes to the splits that can still win. fixed-50 (the profile run), the configurator
  // and live always run to the end (their own ratios are the targets).
  auto prune_bound = [&](bool named_only) {
    if (!prune_slower) return 0.0;
    double b = named_only ? prior_named_s : prior_fixed_s;
    for (const PolicyResult& r : results) {
      const bool is_named =
          r.name == "fixed 50/50" || r.name == "expert-heavy" || r.name == "kv-heavy";
      if (r.live || !r.complete || r.total_s <= 0 || (named_only && !is_named)) continue;
      if (b == 0 || r.total_s < b) b = r.total_s;
    }
    return b > 0 ? 1.02 * b + 1.0 : 0.0;
  };
  SplitProblem profile;
  bool have_profile = false;
  std::string profile_source;
  if (!load_profile_path.empty()) {
    auto lp = load_split_profile(load_profile_path);
    if (!lp.ok()) {
      std::fprintf(stderr, "serve_split_engine_bench: %s\n", lp.status().to_string().c_str());
      return 2;
    }
    const SplitProblem& q = lp->problem;
    const bool sizes_match =
        q.budget_bytes == pool_budget && q.expert_bytes == expert_bytes &&
        q.kv_block_bytes == su.kv_block_bytes && q.kv_floor_blocks == su.floor_blocks &&
        int(q.expert_misses.size()) == spec.layers && q.experts() == spec.experts;
    if (!sizes_match || !lp->meta.contains("key") || lp->meta["key"] != profile_key) {
      std::fprintf(stderr,
                   "serve_split_engine_bench: profile %s was recorded on another geometry, "
                   "workload, budget or link:\n  its key  %s\n  this run %s\n",
                   load_profile_path.c_str(),
                   lp->meta.contains("key") ? lp->meta["key"].dump().c_str() : "(none)",
                   profile_key.dump().c_str());
      return 2;
    }
    profile = q;
    have_profile = true;
    profile_source = load_profile_path;
    std::printf("configurator profile: %s (%s)\n", load_profile_path.c_str(),
                lp->meta.value("recorded", std::string("?")).c_str());
  }

  // The model: routed experts drawn straight into one packed host store in the engine's expert
  // dtype (bench serve's fast path: make_builtin_moe_packed, every core), shared by every
  // policy's engine; f32 experts never exist, so 48 layers take ~58 GB of host memory (bf16
  // experts + f32 dense weights), not 116 GB of f32 experts plus the engine's packed copy.
  const std::size_t expert_params = std::size_t(spec.layers) * std::size_t(spec.experts) * 3 *
                                    std::size_t(spec.hidden) * std::size_t(spec.expert_width);
  const std::size_t dense_params =
      std::size_t(spec.layers) *
          (std::size_t(spec.hidden) * std::size_t(spec.heads + 2 * spec.kv_heads) *
               std::size_t(spec.head_dim) +
           std::size_t(spec.heads) * std::size_t(spec.head_dim) * std::size_t(spec.hidden) +
           std::size_t(spec.hidden) * std::size_t(spec.experts)) +
      2 * std::size_t(spec.vocab) * std::size_t(spec.hidden);
  const std::size_t host_bytes = expert_params * dtype_size(edt) + dense_params * sizeof(float);
  const std::size_t host_avail = host_memory_available_bytes();
  out["geometry"]["host_bytes_estimate"] = host_bytes;
  // The setup is on disk before minutes of weight drawing (a run killed there still says why).
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  std::printf(
      "building the model: %.1f GB of host memory (%.1f GB %s experts + %.1f GB f32 dense), "
      "%.1f GB available\n",
      double(host_bytes) / 1e9, double(expert_params * dtype_size(edt)) / 1e9,
      std::string(to_string(edt)).c_str(), double(dense_params * sizeof(float)) / 1e9,
      double(host_avail) / 1e9);
  std::fflush(stdout);
  if (host_avail > 0 && host_bytes > host_avail / 10 * 9) {
    std::fprintf(stderr,
                 "serve_split_engine_bench: the model needs %.1f GB of host memory, %.1f GB "
                 "available\n",
                 double(host_bytes) / 1e9, double(host_avail) / 1e9);
    return 1;
  }
  ferry::Timer build_timer;
  auto model = make_builtin_moe_packed(spec, seed, edt);
  FERRY_CHECK(model.ok(), "{}", model.status().to_string());
  const double build_s = build_timer.elapsed_s();
  const model::DecoderGeometry& geo = (*model)->geometry;
  FERRY_CHECK(geo.layers == spec.layers && geo.experts == spec.experts && geo.top_k == spec.top_k,
              "bench: the built model's geometry differs from its spec");
  su.model = model->get();
  su.host_store = (*model)->experts.get();
  out["geometry"]["model_build_s"] = build_s;
  out["geometry"]["host_peak_rss_bytes_after_build"] = ferry::host_peak_rss_bytes();
  std::printf(
      "serve_split_engine_bench: device=%s layers=%d (of %d) experts=%d top-%d expert %.2f MB "
      "(%s), pool budget %.3f GiB, kv block %.4f MiB (%s), floor %d blocks; model built in %.1f "
      "s (host peak rss %.1f GB)\n",
      device.c_str(), geo.layers, kLayers, geo.experts, geo.top_k, double(expert_bytes) / 1e6,
      std::string(to_string(edt)).c_str(), double(pool_budget) / double(1ull << 30),
      double(su.kv_block_bytes) / double(1 << 20), std::string(to_string(kv_dtype)).c_str(),
      su.floor_blocks, build_s, double(ferry::host_peak_rss_bytes()) / 1e9);
  std::fflush(stdout);
  auto write_json = [&] {
    double named = 0;
    for (const PolicyResult& r : results) {
      const bool is_named =
          r.name == "fixed 50/50" || r.name == "expert-heavy" || r.name == "kv-heavy";
      if (is_named && r.complete && (named == 0 || r.total_s < named)) named = r.total_s;
    }
    out["best_named_fixed_s"] = named;
    double best = 0;
    for (const PolicyResult& r : results) {
      if (!r.live && r.complete && (best == 0 || r.total_s < best)) best = r.total_s;
    }
    out["best_fixed_s"] = best;
    out["policies"] = nlohmann::json::array();
    for (const PolicyResult& r : results) {
      nlohmann::json j = result_json(r, named);
      j["tokens_equal_first_policy"] = !results.empty() && r.tokens == results.front().tokens;
      j["x_best"] = best > 0 && r.complete && r.total_s > 0 ? best / r.total_s : 0.0;
      out["policies"].push_back(j);
    }
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    return named;
  };
  auto report = [&](const PolicyResult& r) {
    const std::uint64_t acc = r.hits + r.misses;
    std::printf(
        "%-16s %s total %8.2f s  model %7.2f s  ttft mean %6.2f s  gen %7.1f tok/s  dec %7.1f "
        "tok/s  hit %.3f  steps %llu  syncs/step %.2f (decode %.2f)  device-resolved steps "
        "%llu  graph replays %llu  "
        "preempt %llu  pfx hit %llu/%llu  moves %llu/%llu refused %llu  | %s -> %s%s%s\n",
        r.name.c_str(), r.complete ? "ok " : "ERR", r.total_s, r.modelled_s, r.mean_ttft_s,
        r.tokens_per_s, r.decode_s > 0 ? double(r.decode_tokens) / r.decode_s : 0.0,
        acc ? double(r.hits) / double(acc) : 0.0, static_cast<unsigned long long>(r.steps),
        r.steps > 0 ? double(r.host_syncs) / double(r.steps) : 0.0,
        r.decode_steps > 0 ? double(r.decode_host_syncs) / double(r.decode_steps) : 0.0,
        static_cast<unsigned long long>(r.device_resolved_steps),
        static_cast<unsigned long long>(r.graphs.replays),
        static_cast<unsigned long long>(r.preemptions),
        static_cast<unsigned long long>(r.prefix_hit_tokens),
        static_cast<unsigned long long>(r.prefix_query_tokens),
        static_cast<unsigned long long>(r.moves), static_cast<unsigned long long>(r.decisions),
        static_cast<unsigned long long>(r.refused), to_string(r.start).c_str(),
        to_string(r.final_split).c_str(), r.error.empty() ? "" : " error: ", r.error.c_str());
    std::fflush(stdout);
  };
  out["skipped"] = nlohmann::json::array();
  write_json();  // a run stopped during its first policy still leaves the setup and build time
  // --deadline-unix: a policy that cannot get this long before the deadline is not started.
  constexpr double kMinPolicyStartS = 15;
  auto out_of_time = [&](const std::string& what) {
    if (deadline_unix <= 0 || deadline_unix - now_unix_s() >= kMinPolicyStartS) return false;
    std::printf("%s: not started, %.0f s left before --deadline-unix\n", what.c_str(),
                deadline_unix - now_unix_s());
    out["skipped"].push_back(what);
    write_json();
    return true;
  };
  for (const std::string& p : split_list(policies_arg)) {
    if (out_of_time(p)) continue;
    if (p == "fixed-50") {
      SplitProblem run_profile;
      results.push_back(run_policy(su, p, "fixed 50/50", *half, false, &run_profile));
      if (results.back().complete) {
        if (!save_profile_path.empty()) {
          nlohmann::json meta = {{"key", profile_key},
                                 {"recorded", "serve_split_engine_bench fixed-50 on " + device},
                                 {"fixed_50_total_s", results.back().total_s},
                                 {"fixed_50_steps", results.back().steps}};
          const Status st = save_split_profile(save_profile_path,
                                               {.problem = run_profile, .meta = std::move(meta)});
          std::printf("profile %s: %s\n", save_profile_path.c_str(),
                      st.ok() ? "saved" : st.to_string().c_str());
        }
        if (!have_profile) {  // a loaded --configurator-profile wins
          profile = std::move(run_profile);
          have_profile = true;
          profile_source = "fixed-50 run of this process";
        }
      }
    } else if (p == "expert-heavy") {
      results.push_back(
          run_policy(su, p, "expert-heavy", uniform.back(), false, nullptr, prune_bound(true)));
    } else if (p == "kv-heavy") {
      results.push_back(
          run_policy(su, p, "kv-heavy", uniform.front(), false, nullptr, prune_bound(true)));
    } else if (p == "configurator") {
      if (!have_profile) {
        std::printf(
            "configurator: skipped (needs the fixed-50 run's profile first, or "
            "--configurator-profile)\n");
        out["skipped"].push_back(p);
        continue;
      }
      auto s = offline_split(profile, price_by_caps);
      if (!s.ok()) {
        std::printf("configurator: %s\n", s.status().to_string().c_str());
        continue;
      }
      std::printf("configurator: %s from the profile of %s\n", to_string(*s).c_str(),
                  profile_source.c_str());
      results.push_back(run_policy(su, p, "configurator", *s, false, nullptr));
      results.back().profile_source = profile_source;
    } else if (p == "live") {
      results.push_back(run_policy(su, p, "live", *half, true, nullptr));
    } else {  // cap-N: a --caps run at this place in the order (its time cap: "caps")
      auto s = uniform_split(skel, std::atoi(p.c_str() + 4));
      if (!s.ok()) {
        std::printf("%s: %s\n", p.c_str(), s.status().to_string().c_str());
        continue;
      }
      results.push_back(
          run_policy(su, "caps", "cap " + p.substr(4), *s, false, nullptr, prune_bound(false)));
    }
    report(results.back());
    write_json();
  }
  for (const std::string& c : split_list(caps_arg)) {
    if (out_of_time("cap " + c)) continue;
    auto s = uniform_split(skel, std::atoi(c.c_str()));
    if (!s.ok()) {
      std::printf("cap %s: %s\n", c.c_str(), s.status().to_string().c_str());
      continue;
    }
    results.push_back(run_policy(su, "caps", "cap " + c, *s, false, nullptr, prune_bound(false)));
    report(results.back());
    write_json();
  }
  const double named = write_json();
  double best = 0;
  for (const PolicyResult& r : results) {
    if (!r.live && r.complete && (best == 0 || r.total_s < best)) best = r.total_s;
  }
  std::printf("best named fixed split: %.2f s; best fixed split run: %.2f s\n", named, best);
  if (su.model_step_s > 0 || su.model_miss_s > 0) {
    double m_named = 0, m_best = 0;
    for (const PolicyResult& r : results) {
      if (r.live || !r.complete) continue;
      const bool is_named =
          r.name == "fixed 50/50" || r.name == "expert-heavy" || r.name == "kv-heavy";
      if (is_named && (m_named == 0 || r.modelled_s < m_named)) m_named = r.modelled_s;
      if (m_best == 0 || r.modelled_s < m_best) m_best = r.modelled_s;
    }
    std::printf("modelled (%.2f ms/step + %.3f ms/miss on this run's counters):\n",
                su.model_step_s * 1e3, su.model_miss_s * 1e3);
    for (const PolicyResult& r : results) {
      if (!r.complete || r.modelled_s <= 0) continue;
      std::printf("  %-16s %8.2f s  x_named %.3f  x_best %.3f\n", r.name.c_str(), r.modelled_s,
                  m_named / r.modelled_s, m_best / r.modelled_s);
    }
  }
  for (const PolicyResult& r : results) {
    if (r.complete && r.total_s > 0 && named > 0) {
      std::printf("  %-16s x_named %.3f  x_best %.3f\n", r.name.c_str(), named / r.total_s,
                  best / r.total_s);
    }
    if (!r.live) continue;
    for (const DecisionRecord& d : r.log) {
      std::printf("    live step %5llu: %8.3f -> %8.3f ms  mig %7.3f ms  %s  %s\n",
                  static_cast<unsigned long long>(d.step), d.current_s * 1e3, d.target_s * 1e3,
                  d.migration_s * 1e3, d.applied ? "MOVED" : (d.move ? "REFUSED" : "keep"),
                  to_string(d.target).c_str());
    }
    if (!r.last_refusal.empty()) std::printf("    last refusal: %s\n", r.last_refusal.c_str());
  }
  bool all_ok = true;
  for (const PolicyResult& r : results) all_ok = all_ok && r.complete;
  return all_ok ? 0 : 1;
}
