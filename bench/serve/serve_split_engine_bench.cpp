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
// The engine's expert slots are bf16 on CUDA (f32 on the CPU), its KV rows f32 (twice the bf16
// KV the simulator assumes, so the KV floor takes twice its share). The CUDA engine's dense
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
// --scaled (CPU, 2 layers): the 2-layer CUDA run's split problem at 1/32 of the widths (same E,
// top-k, routing, slots, blocks, floor and modelled miss cost; see main()), so LiveSplit decides
// as it would on the GPU; its wall time is CPU compute, not a GPU's. --model-step-ms /
// --model-miss-ms price a run's own counters (steps, pager misses) with a step model, e.g. one
// fitted to an H200 run (docs/serve_wsa.md): "modelled_s" in the JSON, ratios on it printed.
// --policy-s caps the wall time of policies named as in --policies ("caps": each --caps run;
// others: --max-policy-s); a policy past its cap is stopped and reported incomplete. --phase-turns:
// the phased workload variant (agentic_workload.h). x_best = the fastest complete fixed split of
// this run (named, caps and configurator: the oracle when --caps sweeps every cap) / policy. The
// live policy's JSON has every decision (live_log: step, modelled T of the held and target split,
// migration, move, applied) and the last refusal's reason.
#include <sys/utsname.h>
#include <algorithm>
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
#include "core/timer.h"
#include "kernels/backend.h"
#include "serve/builtin_model.h"
#include "serve/engine.h"
#include "serve/routing_trace.h"
#include "serve/wsa/agentic_workload.h"
#include "serve/wsa/live_split.h"
#include "serve/wsa/split_allocator.h"
#include "serve/wsa/split_sim.h"

namespace {

using namespace ferry;
using namespace ferry::serve;
using namespace ferry::serve::wsa;

// Forces the workload's route of (session, position, layer) for every request of a session.
class AgenticRouter : public RoutingHook {
 public:
  explicit AgenticRouter(const AgenticWorkload& w) : w_(w) {}
  void bind(RequestId id, int session) { session_of_[id] = session; }
  Status on_route(const RouteKey& key, std::span<std::int32_t> ids) override {
    const auto it = session_of_.find(key.request);
    if (it == session_of_.end()) return not_found("bench: request {} has no session", key.request);
    const auto r = w_.route(it->second, key.position, key.layer);
    for (std::size_t k = 0; k < ids.size(); ++k) ids[k] = r[k];
    return ok_status();
  }

 private:
  const AgenticWorkload& w_;
  std::map<RequestId, int> session_of_;
};

struct PolicyResult {
  std::string name;
  Split start;
  bool live = false, complete = false;
  double total_s = 0, mean_ttft_s = 0, median_ttft_s = 0, tokens_per_s = 0;
  std::uint64_t generated = 0, steps = 0, preemptions = 0, recompute_tokens = 0;
  std::uint64_t hits = 0, misses = 0, prefill_tokens = 0, prefix_hit_tokens = 0;
  std::uint64_t prefix_query_tokens = 0, resizes = 0, blocks_moved = 0, decisions = 0, moves = 0;
  std::size_t device_peak = 0, pool_max_bytes = 0;
  std::vector<std::uint64_t> resize_steps;  // steps after which the pools had been resized
  std::vector<DecisionRecord> log;          // live: every decision
  std::uint64_t refused = 0;
  std::string last_refusal;
  double cap_s = 0;       // the time cap it ran under
  double modelled_s = 0;  // --model-step-ms x steps + --model-miss-ms x misses (0: not asked)
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
  double model_step_s = 0, model_miss_s = 0;         // --model-step-ms, --model-miss-ms
};

// One engine, one policy: fixed at `start`, or (live) configure_auto_split + LiveSplit. With
// `profile`, a fixed run is observed by a LiveSplit that never decides and its curves returned.
PolicyResult run_policy(const Setup& su, const std::string& key, const std::string& name,
                        const Split& start, bool live, SplitProblem* profile) {
  PolicyResult pr{.name = name, .start = start, .live = live};
  const model::DecoderGeometry& geo = su.model->geometry;
  EngineConfig ec;
  ec.max_running = su.concurrency;
  ec.max_batch_tokens = su.max_batch_tokens;
  ec.kv.block_tokens = su.block_tokens;
  ec.kv.prefix_cache = su.prefix_cache;
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
  auto eng_r = Engine::create(geo, su.model->params, ec, *su.backend);
  if (!eng_r.ok()) {
    pr.error = eng_r.status().to_string();
    return pr;
  }
  Engine& eng = **eng_r;
  std::unique_ptr<LiveSplit> ls;
  if (live || profile != nullptr) {
    auto r =
        LiveSplit::attach(eng, {.budget_bytes = su.pool_budget,
                                .concurrency = su.concurrency,
                                .max_context_tokens = su.w->max_context(),
                                .decide_every_steps = live ? su.decide_every_steps : (1 << 30),
                                .min_decide_steps = su.min_decide_steps,
                                .decide_accesses_per_expert = live ? su.decide_per_expert : 0.0,
                                .link_bytes_per_s = su.link_bytes_per_s,
                                .controller = {.min_hysteresis = su.min_hysteresis,
                                               .uniform_tie = su.uniform_tie,
                                               .of_avoidable = su.band_of_avoidable}});
    if (!r.ok()) {
      pr.error = r.status().to_string();
      return pr;
    }
    ls = std::move(*r);
  }
  const AgenticWorkload& w = *su.w;
  AgenticRouter router(w);
  eng.set_routing_hook(&router);
  const int vocab = geo.vocab;
  std::map<RequestId, std::pair<int, int>> turn_of;
  std::map<int, std::vector<std::int32_t>> prompt_of;
  std::map<RequestId, double> submitted;
  std::vector<double> ttft;
  const auto cap_it = su.policy_s.find(key);
  pr.cap_s = cap_it != su.policy_s.end() ? cap_it->second : su.max_policy_s;
  ferry::Timer clock;
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
    if (clock.elapsed_s() > pr.cap_s) {
      failed = deadline_exceeded("bench: {} ran past its time cap of {} s", name, pr.cap_s);
      break;
    }
    const std::uint64_t resizes = eng.stats().pool_resizes;
    auto ev = eng.step();
    if (!ev.ok()) {
      failed = ev.status();
      break;
    }
    if (eng.stats().pool_resizes != resizes) pr.resize_steps.push_back(eng.stats().steps);
    const double now = clock.elapsed_s();
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
  const PagerCounters& pc = eng.experts().pager()->counters();
  pr.hits = pc.hits;
  pr.misses = pc.misses;
  pr.modelled_s = su.model_step_s * double(pr.steps) + su.model_miss_s * double(pr.misses);
  pr.device_peak = eng.device_budget().bytes_peak();
  pr.final_split.kv_blocks = eng.kv().num_blocks();
  for (int l = 0; l < geo.layers; ++l) {
    pr.final_split.slots.push_back(eng.experts().pager()->capacity(l));
  }
  pr.pool_max_bytes = pr.final_split.bytes(
      {.expert_bytes = eng.experts().store()->expert_bytes(), .kv_block_bytes = su.kv_block_bytes});
  if (ls) {
    pr.decisions = ls->stats().decisions;
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
          {"cap_s", r.cap_s},
          {"modelled_s", r.modelled_s},
          {"pool_max_bytes", r.pool_max_bytes},
          {"device_peak_bytes", r.device_peak},
          {"x_named", named_s > 0 && r.complete && r.total_s > 0 ? named_s / r.total_s : 0.0}};
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
  std::string policy_s_arg;
  std::uint64_t seed = 1;
  bool prefix_cache = true, tiny = false, scaled = false;
  double model_step_ms = 0, model_miss_ms = 0;
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
    else {
      std::fprintf(stderr, "serve_split_engine_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
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
  // of the 16 x 4 x 128 x 4 x 2 x 2 one; the pool budget and the link are divided by 32 too, so
  // slots, blocks, the floor and a miss's modelled cost (bytes / link) are the GPU run's.
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
  ferry::Timer build_timer;
  auto model = make_builtin_moe(spec, seed);
  FERRY_CHECK(model.ok(), "{}", model.status().to_string());
  const double build_s = build_timer.elapsed_s();
  const model::DecoderGeometry& geo = (*model)->geometry;
  const DType edt = cuda ? DType::kBF16 : DType::kF32;
  const std::size_t expert_bytes =
      3 * std::size_t(geo.hidden) * std::size_t(geo.expert_width) * dtype_size(edt);
  const AgenticWorkload w({.sessions = sessions,
                           .turns = turns,
                           .prefix_tokens = prefix,
                           .user_max = user_max,
                           .output_max = output_max,
                           .phase_turns = phase_turns,
                           .long_output_min = long_output_min,
                           .long_output_max = long_output_max,
                           .moe_layers = geo.layers,
                           .experts = geo.experts,
                           .top_k = geo.top_k,
                           .seed = seed});
  Setup su{.model = model->get(),
           .w = &w,
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
           .model_step_s = model_step_ms * 1e-3,
           .model_miss_s = model_miss_ms * 1e-3};
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
  su.kv_block_bytes = std::size_t(geo.layers) * 2 * std::size_t(su.block_tokens) *
                      std::size_t(geo.kv_heads) * std::size_t(geo.head_dim) * sizeof(float);
  su.floor_blocks = concurrency * ((w.max_context() + su.block_tokens - 1) / su.block_tokens);
  if (tiny) {
    // 40 % of the experts' bytes (the share 24 GiB leaves them on the target) + 1.5x the floor.
    su.pool_budget = std::size_t(0.4 * double(expert_bytes) * geo.experts * geo.layers) +
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
  const SplitProblem skel = sim_problem(sc, geo.layers, geo.experts, geo.top_k);
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
  out["geometry"] = {{"layers", geo.layers},
                     {"of_target_layers", kLayers},
                     {"hidden", geo.hidden},
                     {"experts", geo.experts},
                     {"top_k", geo.top_k},
                     {"expert_width", geo.expert_width},
                     {"vocab", geo.vocab},
                     {"tiny", tiny},
                     {"scaled", scaled},
                     {"expert_dtype", std::string(to_string(edt))},
                     {"expert_bytes", expert_bytes},
                     {"kv_block_bytes", su.kv_block_bytes},
                     {"model_build_s", build_s}};
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
  std::printf(
      "serve_split_engine_bench: device=%s layers=%d (of %d) experts=%d top-%d expert %.2f MB "
      "(%s), pool budget %.3f GiB, kv block %.2f MiB, floor %d blocks; model built in %.1f s\n",
      device.c_str(), geo.layers, kLayers, geo.experts, geo.top_k, double(expert_bytes) / 1e6,
      std::string(to_string(edt)).c_str(), double(pool_budget) / double(1ull << 30),
      double(su.kv_block_bytes) / double(1 << 20), su.floor_blocks, build_s);
  std::fflush(stdout);

  std::vector<PolicyResult> results;
  SplitProblem profile;
  bool have_profile = false;
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
        "%-16s %s total %8.2f s  model %7.2f s  ttft mean %6.2f s  gen %7.1f tok/s  hit %.3f  "
        "steps %llu  "
        "preempt %llu  pfx hit %llu/%llu  moves %llu/%llu refused %llu  | %s -> %s%s%s\n",
        r.name.c_str(), r.complete ? "ok " : "ERR", r.total_s, r.modelled_s, r.mean_ttft_s,
        r.tokens_per_s, acc ? double(r.hits) / double(acc) : 0.0,
        static_cast<unsigned long long>(r.steps), static_cast<unsigned long long>(r.preemptions),
        static_cast<unsigned long long>(r.prefix_hit_tokens),
        static_cast<unsigned long long>(r.prefix_query_tokens),
        static_cast<unsigned long long>(r.moves), static_cast<unsigned long long>(r.decisions),
        static_cast<unsigned long long>(r.refused), to_string(r.start).c_str(),
        to_string(r.final_split).c_str(), r.error.empty() ? "" : " error: ", r.error.c_str());
    std::fflush(stdout);
  };
  for (const std::string& p : split_list(policies_arg)) {
    if (p == "fixed-50") {
      results.push_back(run_policy(su, p, "fixed 50/50", *half, false, &profile));
      have_profile = results.back().complete;
    } else if (p == "expert-heavy") {
      results.push_back(run_policy(su, p, "expert-heavy", uniform.back(), false, nullptr));
    } else if (p == "kv-heavy") {
      results.push_back(run_policy(su, p, "kv-heavy", uniform.front(), false, nullptr));
    } else if (p == "configurator") {
      if (!have_profile) {
        std::printf("configurator: skipped (needs the fixed-50 run's profile first)\n");
        continue;
      }
      auto s = allocate(profile);
      if (!s.ok()) {
        std::printf("configurator: %s\n", s.status().to_string().c_str());
        continue;
      }
      results.push_back(run_policy(su, p, "configurator", *s, false, nullptr));
    } else if (p == "live") {
      results.push_back(run_policy(su, p, "live", *half, true, nullptr));
    } else {
      std::fprintf(stderr, "serve_split_engine_bench: unknown policy %s\n", p.c_str());
      return 2;
    }
    report(results.back());
    write_json();
  }
  for (const std::string& c : split_list(caps_arg)) {
    auto s = uniform_split(skel, std::atoi(c.c_str()));
    if (!s.ok()) {
      std::printf("cap %s: %s\n", c.c_str(), s.status().to_string().c_str());
      continue;
    }
    results.push_back(run_policy(su, "caps", "cap " + c, *s, false, nullptr));
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
