// SPDX-License-Identifier: Apache-2.0
// serve_split_bench: compares ways of dividing one budget between expert slots and KV blocks on
// the same multi-session agentic workload, with the trace-driven simulator (serve/wsa/split_sim.h):
//   fixed 50/50, expert-heavy (all but the KV floor to experts), KV-heavy (top-k slots per layer),
//   MV-WSA offline (allocate() on curves profiled in a 50/50 run, then fixed), MV-WSA live (the
//   controller from 50/50), and the oracle (best uniform split by exhaustive search over caps).
// Default geometry: Qwen3-30B-A3B bf16 (48 MoE layers, 128 experts, top-8, expert 2048x768x3,
// 4 KV heads x 128, vocab 151936), 24 GiB total budget minus dense weights and a workspace
// reserve. Every time it prints is a model output (step_base_s + token_s * tokens +
// misses * expert_bytes / link), not a GPU measurement; it states the machine it ran on.
// --prefix-cache off|on|both: every policy without and/or with the engine's automatic prefix
// cache (a turn reuses the cached blocks of its session's history; split_sim.h).
//   serve_split_bench [--budget-gib 24] [--link-gbps 24] [--sessions 8] [--concurrency 4]
//                     [--turns 4] [--prefix 1536] [--seed 1] [--json FILE]
//                     [--live-decide-steps 64] [--live-age 0.9] [--live-hysteresis 0.05]
//                     [--prefix-cache both] [--live-warmup-steps 0] [--live-reuse-prior on]
//                     [--oracle on] [--user-max 256] [--output-max 256] [--think-s 0]
//                     [--live-min-steps 4] [--live-decide-per-expert 2] [--trace-live off]
//                     [--phase-turns 0] [--long-output-min 512] [--long-output-max 1024]
//                     [--layers 48] [--kv-bytes 2] [--max-batch-tokens 512]
//                     [--step-base-ms 5] [--token-ms 0.1] [--alloc-tie 1e-3]
//                     [--configurator-price-by-caps on|off|both] [--live-price-by-caps off]
// --live-decide-steps is the longest interval between live decisions, --live-decide-per-expert x E
// the mean expert accesses per MoE layer after which it decides sooner (0: the old fixed cadence),
// --live-age the curve weight kept per 64 steps (split_controller.h DecisionCadence);
// --trace-live on prints every live decision. --live-min-hysteresis (0.01) / --live-uniform-tie
// (0.01): the controller's confidence-scaled band and tie rule (split_controller.h); the first
// version's controller is --live-decide-per-expert 0 --live-min-hysteresis 0.05
// --live-uniform-tie 0 --live-band-of total. --phase-turns N: the phased workload variant
// (agentic_workload.h: phases of N chat turns and N long-answer turns). --layers N / --kv-bytes 4:
// the engine bench's scaled geometry (N of 48 layers, pool budget x N / 48, f32 KV rows);
// --step-base-ms / --token-ms: the step model's constants (e.g. fitted to a GPU run).
// --alloc-tie: the allocator's balance_tie for the offline and live policies (split_allocator.h;
// 0: the plain greedy, ties to a corner split -- the allocator before the tie-break).
// --configurator-price-by-caps on (the default): the offline policy allocates with a recomputed
// prompt block priced at each split's own caps (split_allocator.h allocate_priced_by_caps; off:
// allocate() at the profile's one price, the configurator before session 30);
// both: "mv-wsa offline" priced by caps and a row "offline, one-shot" with allocate(), on the
// same profile (one run for the before/after comparison).
// --live-price-by-caps on: the live controller decides with that price too
// (ControllerConfig::price_by_caps); both: also a row "mv-wsa live, by caps" (from 50/50).
// With the prefix cache, "mv-wsa live" uses the prefix curve's reuse prior (prefix_curve.h;
// --live-reuse-prior off drops it) and "mv-wsa live, no prior" is the controller without it.
// x_named: the best of the three named fixed splits (50/50, expert-heavy, KV-heavy) / policy;
// x_best: the oracle / policy (--oracle off skips its exhaustive search: x_best then empty).
#include <sys/utsname.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/cpu_info.h"
#include "core/timer.h"
#include "serve/wsa/split_sim.h"

namespace {

using namespace ferry::serve::wsa;

// Steps at which the live controller decided (all) or moved (moves only).
std::vector<std::uint64_t> decision_steps(const SimResult& r, bool all) {
  std::vector<std::uint64_t> out;
  for (const DecisionRecord& d : r.log) {
    if (all || d.applied) out.push_back(d.step);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  double budget_gib = 24, link_gbps = 24;
  int sessions = 8, concurrency = 4, turns = 4, prefix = 1536;
  std::uint64_t seed = 1;
  std::string json_path;
  int decide_steps = 64;
  double age = 0.9, hysteresis = 0.05;
  std::string prefix_cache = "both";
  int warmup = 0, min_steps = 4;
  double min_hysteresis = 0.01, uniform_tie = 0.01;
  bool band_of_avoidable = true;
  double decide_per_expert = 2;
  bool reuse_prior = true, oracle = true;
  int user_max = 256, output_max = 256;
  int phase_turns = 0, long_output_min = 512, long_output_max = 1024;
  double think_s = 0;
  // The engine bench's scaled geometry (serve_split_engine_bench --layers N): N of the 48 layers,
  // the pool budget x N / 48, KV rows of kv_bytes (2: bf16, the target's; 4: the engine's f32).
  int layers = 48, kv_bytes = 2, max_batch_tokens = 512;
  double step_base_ms = 5, token_ms = 0.1;
  bool trace_live = false;
  // --configurator-price-by-caps (default on since session 30, docs/serve_wsa.md):
  // allocate_priced_by_caps offline; off: allocate() at the profile's one price.
  bool price_by_caps = true;
  bool also_one_shot = false;  // ... both: also the one-shot allocate() as its own row
  // --live-price-by-caps: the live controller prices a recomputed block at each split's caps
  // (ControllerConfig::price_by_caps); both: the live rows without, plus "mv-wsa live, by caps".
  bool live_price_by_caps = false, live_both = false;
  AllocatorOptions alloc;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--budget-gib")
      budget_gib = std::atof(v);
    else if (a == "--link-gbps")
      link_gbps = std::atof(v);
    else if (a == "--sessions")
      sessions = std::atoi(v);
    else if (a == "--concurrency")
      concurrency = std::atoi(v);
    else if (a == "--turns")
      turns = std::atoi(v);
    else if (a == "--prefix")
      prefix = std::atoi(v);
    else if (a == "--seed")
      seed = std::strtoull(v, nullptr, 10);
    else if (a == "--json")
      json_path = v;
    else if (a == "--live-decide-steps")
      decide_steps = std::atoi(v);
    else if (a == "--live-age")
      age = std::atof(v);
    else if (a == "--live-hysteresis")
      hysteresis = std::atof(v);
    else if (a == "--prefix-cache")
      prefix_cache = v;
    else if (a == "--live-min-hysteresis")
      min_hysteresis = std::atof(v);
    else if (a == "--live-band-of")
      band_of_avoidable = std::strcmp(v, "total") != 0;
    else if (a == "--live-uniform-tie")
      uniform_tie = std::atof(v);
    else if (a == "--live-min-steps")
      min_steps = std::atoi(v);
    else if (a == "--live-decide-per-expert")
      decide_per_expert = std::atof(v);
    else if (a == "--live-warmup-steps")
      warmup = std::atoi(v);
    else if (a == "--live-reuse-prior")
      reuse_prior = std::strcmp(v, "off") != 0;
    else if (a == "--oracle")
      oracle = std::strcmp(v, "off") != 0;
    else if (a == "--user-max")
      user_max = std::atoi(v);
    else if (a == "--output-max")
      output_max = std::atoi(v);
    else if (a == "--think-s")
      think_s = std::atof(v);
    else if (a == "--phase-turns")
      phase_turns = std::atoi(v);
    else if (a == "--long-output-min")
      long_output_min = std::atoi(v);
    else if (a == "--long-output-max")
      long_output_max = std::atoi(v);
    else if (a == "--layers")
      layers = std::atoi(v);
    else if (a == "--kv-bytes")
      kv_bytes = std::atoi(v);
    else if (a == "--max-batch-tokens")
      max_batch_tokens = std::atoi(v);
    else if (a == "--step-base-ms")
      step_base_ms = std::atof(v);
    else if (a == "--token-ms")
      token_ms = std::atof(v);
    else if (a == "--trace-live")
      trace_live = std::strcmp(v, "off") != 0;
    else if (a == "--configurator-price-by-caps")
      price_by_caps = std::strcmp(v, "off") != 0, also_one_shot = std::strcmp(v, "both") == 0;
    else if (a == "--live-price-by-caps")
      live_price_by_caps = std::strcmp(v, "on") == 0, live_both = std::strcmp(v, "both") == 0;
    else if (a == "--alloc-tie")
      alloc.balance_tie = std::atof(v);
    else {
      std::fprintf(stderr, "serve_split_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  // Qwen3-30B-A3B, bf16.
  constexpr int kLayers = 48, kExperts = 128, kTopK = 8, kHidden = 2048, kExpertWidth = 768;
  constexpr int kHeads = 32, kKvHeads = 4, kHeadDim = 128, kVocab = 151936;
  const std::size_t expert_bytes = 3ull * kHidden * kExpertWidth * 2;
  FERRY_CHECK(layers >= 1 && layers <= kLayers && (kv_bytes == 2 || kv_bytes == 4),
              "--layers 1..48, --kv-bytes 2|4");
  const std::size_t kv_per_token =
      std::size_t(layers) * 2 * kKvHeads * kHeadDim * std::size_t(kv_bytes);
  const std::size_t attn = std::size_t(kHidden) * kHeads * kHeadDim * 2 +
                           std::size_t(kHidden) * kKvHeads * kHeadDim * 2;  // q,o + k,v
  const std::size_t dense_bytes =
      2 * (2ull * kVocab * kHidden + kLayers * (attn + std::size_t(kHidden) * kExperts));
  const std::size_t workspace_bytes = 1ull << 30;  // activations + workspace reserve (assumed)
  const std::size_t total = std::size_t(budget_gib * double(1ull << 30));

  SimConfig cfg;
  cfg.expert_bytes = expert_bytes;
  cfg.kv_bytes_per_token = kv_per_token;
  cfg.block_tokens = 16;
  cfg.budget_bytes = std::size_t(double(total - dense_bytes - workspace_bytes) * layers / kLayers);
  cfg.max_running = concurrency;
  cfg.max_batch_tokens = max_batch_tokens;
  cfg.step_base_s = step_base_ms * 1e-3;
  cfg.token_s = token_ms * 1e-3;
  cfg.link_bytes_per_s = link_gbps * 1e9;
  cfg.decide_every_steps = decide_steps;
  cfg.warmup_steps = warmup;
  cfg.min_decide_steps = min_steps;
  cfg.decide_accesses_per_expert = decide_per_expert;
  cfg.age_factor = age;
  cfg.reuse_prior = reuse_prior;
  cfg.controller = {.hysteresis = hysteresis,
                    .min_hysteresis = min_hysteresis,
                    .horizon_steps = 256,
                    .link_bytes_per_s = cfg.link_bytes_per_s,
                    .uniform_tie = uniform_tie,
                    .of_avoidable = band_of_avoidable,
                    .allocator = alloc,
                    .price_by_caps = live_price_by_caps};

  ferry::Timer gen_timer;
  const AgenticWorkload w({.sessions = sessions,
                           .turns = turns,
                           .prefix_tokens = prefix,
                           .user_max = user_max,
                           .output_max = output_max,
                           .think_s = think_s,
                           .phase_turns = phase_turns,
                           .long_output_min = long_output_min,
                           .long_output_max = long_output_max,
                           .moe_layers = layers,
                           .experts = kExperts,
                           .top_k = kTopK,
                           .seed = seed});
  const double gen_s = gen_timer.elapsed_s();
  cfg.kv_floor_blocks = concurrency * ((w.max_context() + cfg.block_tokens - 1) / cfg.block_tokens);
  const SplitProblem skel = sim_problem(cfg, layers, kExperts, kTopK);

  struct Row {
    std::string name;
    Split split;
    SimResult r;
    bool live = false;
  };
  struct Suite {
    bool prefix_cache = false;
    std::vector<Row> rows;
    double best_s = 0;                          // oracle (0: not searched)
    std::vector<std::pair<int, double>> sweep;  // oracle: (uniform cap, total_s)
    double named_s = 0;                         // best of the three named fixed splits
  };
  std::vector<Suite> suites;
  ferry::Timer sim_timer;
  for (bool pc : {false, true}) {
    if ((pc && prefix_cache == "off") || (!pc && prefix_cache == "on")) continue;
    cfg.prefix_cache = pc;
    Suite suite{.prefix_cache = pc};
    std::vector<Row>& rows = suite.rows;
    auto run = [&](const std::string& name, const Split& s, bool live) -> SimResult {
      auto r = simulate(cfg, w, s, live);
      FERRY_CHECK(r.ok(), "{}: {}", name, r.status().to_string());
      rows.push_back({name, live ? r->final_split : s, *r, live});
      return *r;
    };
    auto half = fraction_split(skel, 0.5);
    FERRY_CHECK(half.ok(), "50/50: {}", half.status().to_string());
    const std::vector<Split> uniform = all_uniform_splits(skel);
    FERRY_CHECK(!uniform.empty(), "no uniform split fits the budget");
    const SplitProblem profile = run("fixed 50/50", *half, false).profile;  // a copy: rows grows
    run("expert-heavy", uniform.back(), false);
    run("kv-heavy", uniform.front(), false);
    suite.named_s = std::min({rows[0].r.total_s, rows[1].r.total_s, rows[2].r.total_s});
    auto offline = offline_split(profile, price_by_caps, alloc);
    FERRY_CHECK(offline.ok(), "offline: {}", offline.status().to_string());
    run("mv-wsa offline", *offline, false);
    if (also_one_shot) {
      auto one_shot = allocate(profile, alloc);
      FERRY_CHECK(one_shot.ok(), "offline, one-shot: {}", one_shot.status().to_string());
      run("offline, one-shot", *one_shot, false);
    }
    run("mv-wsa live", *half, true);
    if (live_both && pc) {
      cfg.controller.price_by_caps = true;
      run("mv-wsa live, by caps", *half, true);
      cfg.controller.price_by_caps = false;
    }
    if (pc && cfg.reuse_prior) {
      cfg.reuse_prior = false;
      run("mv-wsa live, no prior", *half, true);
      cfg.reuse_prior = true;
    }
    run("mv-wsa live@offline", *offline, true);  // live, started from the configurator's split
    // Oracle: every uniform cap.
    if (oracle) {
      double best_s = 1e300;
      Split best;
      SimResult best_r;
      for (const Split& u : uniform) {
        auto r = simulate(cfg, w, u, false);
        FERRY_CHECK(r.ok(), "oracle: {}", r.status().to_string());
        suite.sweep.push_back({u.slots.front(), r->total_s});
        if (r->total_s < best_s) best_s = r->total_s, best = u, best_r = *r;
      }
      rows.push_back({"oracle (best fixed)", best, best_r, false});
      suite.best_s = best_s;
    }
    suites.push_back(std::move(suite));
  }
  const double sim_s = sim_timer.elapsed_s();

  utsname un{};
  uname(&un);
  std::printf(
      "serve-split simulator: Qwen3-30B-A3B geometry bf16 (%d of 48 layers, KV %d bytes/elt), "
      "total budget %.1f GiB (experts+KV %.3f GiB = (total - %.2f GiB dense - %.2f GiB "
      "workspace) x %d/48)\n",
      layers, kv_bytes, budget_gib, double(cfg.budget_bytes) / double(1ull << 30),
      double(dense_bytes) / double(1ull << 30), double(workspace_bytes) / double(1ull << 30),
      layers);
  std::printf(
      "workload: %d sessions x %d turns, prefix ~%d tokens, concurrency %d, max context %d, "
      "kv floor %d blocks (%.2f GiB)\n",
      sessions, turns, prefix, concurrency, w.max_context(), cfg.kv_floor_blocks,
      double(cfg.kv_floor_blocks) * double(cfg.kv_block_bytes()) / double(1ull << 30));
  std::printf(
      "model: step %.1f ms + %.2f ms/token + misses x %.2f ms (%.1f GB/s link); machine: "
      "%s (%s %s); routing %.1f s, simulations %.1f s\n",
      cfg.step_base_s * 1e3, cfg.token_s * 1e3, double(expert_bytes) / cfg.link_bytes_per_s * 1e3,
      link_gbps, ferry::cpu_model_name().c_str(), un.sysname, un.release, gen_s, sim_s);
  nlohmann::json j;
  j["what"] = "trace-driven split simulator (serve/wsa/split_sim.h); modelled times, not GPU runs";
  j["machine"] = {{"cpu", ferry::cpu_model_name()},
                  {"os", std::string(un.sysname) + " " + un.release}};
  j["geometry"] = "Qwen3-30B-A3B bf16";
  j["layers"] = layers;
  j["kv_bytes"] = kv_bytes;
  j["max_batch_tokens"] = max_batch_tokens;
  j["budget_gib"] = budget_gib;
  j["experts_kv_budget_bytes"] = cfg.budget_bytes;
  j["link_gbps"] = link_gbps;
  j["step_base_s"] = cfg.step_base_s;
  j["token_s"] = cfg.token_s;
  j["workload"] = {{"sessions", sessions},
                   {"turns", turns},
                   {"prefix", prefix},
                   {"user_max", user_max},
                   {"output_max", output_max},
                   {"think_s", think_s},
                   {"phase_turns", phase_turns},
                   {"long_output_min", long_output_min},
                   {"long_output_max", long_output_max},
                   {"concurrency", concurrency},
                   {"max_context", w.max_context()},
                   {"seed", seed}};
  j["kv_floor_blocks"] = cfg.kv_floor_blocks;
  j["live"] = {{"decide_every_steps", decide_steps},
               {"min_decide_steps", min_steps},
               {"min_hysteresis", min_hysteresis},
               {"uniform_tie", uniform_tie},
               {"band_of_avoidable", band_of_avoidable},
               {"decide_accesses_per_expert", decide_per_expert},
               {"age_factor", age},
               {"hysteresis", hysteresis},
               {"warmup_steps", warmup},
               {"reuse_prior", reuse_prior},
               {"alloc_balance_tie", alloc.balance_tie},
               {"configurator_price_by_caps", price_by_caps},
               {"configurator_one_shot_row", also_one_shot},
               {"live_price_by_caps", live_both            ? "both"
                                      : live_price_by_caps ? "on"
                                                           : "off"}};
  for (const Suite& suite : suites) {
    nlohmann::json sweep = nlohmann::json::array();
    for (const auto& [cap, t] : suite.sweep) sweep.push_back({{"cap", cap}, {"total_s", t}});
    j[suite.prefix_cache ? "oracle_sweep_prefix_cache_on" : "oracle_sweep_prefix_cache_off"] =
        sweep;
    std::printf("\nprefix cache %s\n", suite.prefix_cache ? "ON" : "OFF");
    std::printf("%-22s %10s %9s %9s %7s %8s %9s %8s %7s %6s %5s  %s\n", "policy", "total_s",
                "ttft_s", "dec_tok/s", "hit", "preempt", "prefill", "pfx_hit", "x_named", "x_best",
                "moves", "split");
    for (const Row& row : suite.rows) {
      const double x = suite.best_s / row.r.total_s;
      const double xn = suite.named_s / row.r.total_s;
      std::printf("%-22s %10.1f %9.2f %9.2f %7.3f %8llu %9llu %8.3f %7.3f %6.3f %5llu  %s%s\n",
                  row.name.c_str(), row.r.total_s, row.r.mean_ttft_s, row.r.decode_tokens_per_s,
                  row.r.hit_rate(), static_cast<unsigned long long>(row.r.preemptions),
                  static_cast<unsigned long long>(row.r.prefill_tokens), row.r.prefix_hit_rate(),
                  xn, x, static_cast<unsigned long long>(row.r.moves), row.live ? "final " : "",
                  to_string(row.split).c_str());
      j[suite.prefix_cache ? "prefix_cache_on" : "prefix_cache_off"].push_back(
          {{"name", row.name},
           {"total_s", row.r.total_s},
           {"mean_ttft_s", row.r.mean_ttft_s},
           {"decode_tokens_per_s", row.r.decode_tokens_per_s},
           {"hit_rate", row.r.hit_rate()},
           {"preemptions", row.r.preemptions},
           {"recompute_tokens", row.r.recompute_tokens},
           {"prefill_tokens", row.r.prefill_tokens},
           {"prefix_query_blocks", row.r.prefix_query_blocks},
           {"prefix_hit_blocks", row.r.prefix_hit_blocks},
           {"prefix_model_hit_blocks", row.r.prefix_model_hit_blocks},
           {"prefix_evictions", row.r.prefix_evictions},
           {"moves", row.r.moves},
           {"speed_vs_best_fixed", x},
           {"speed_vs_best_named_fixed", xn},
           {"slots", row.split.slots},
           {"kv_blocks", row.split.kv_blocks},
           {"decision_steps", decision_steps(row.r, true)},
           {"move_steps", decision_steps(row.r, false)},
           {"decide_s", row.r.decide_s}});
    }
    for (const Row& row : suite.rows) {  // host time per live decision (this machine, wall)
      if (!row.live || row.r.log.empty()) continue;
      std::printf("  %s: %zu decisions, %.3f ms each (problem + decide, wall)\n", row.name.c_str(),
                  row.r.log.size(), row.r.decide_s * 1e3 / double(row.r.log.size()));
    }
    for (const Row& row : suite.rows) {
      if (!trace_live || !row.live) continue;
      std::printf("  %s: decisions (step: T(current) -> T(target) ms, migration ms, move)\n",
                  row.name.c_str());
      for (const DecisionRecord& d : row.r.log) {
        std::printf("    %6llu: %8.3f -> %8.3f  mig %7.3f  %s  %s\n",
                    static_cast<unsigned long long>(d.step), d.current_s * 1e3, d.target_s * 1e3,
                    d.migration_s * 1e3, d.move ? "MOVE" : "keep", to_string(d.target).c_str());
      }
    }
  }
  if (suites.size() == 2) {
    std::printf("\nbest fixed split: %.1f s without the prefix cache, %.1f s with it (%.3fx)\n",
                suites[0].best_s, suites[1].best_s, suites[0].best_s / suites[1].best_s);
  }
  std::printf(
      "x_best: oracle total / policy total within the same prefix-cache setting (> 1 is faster "
      "than the best fixed split); prefill: computed prompt tokens; pfx_hit: prompt blocks found "
      "cached / looked up\n");
  if (!json_path.empty()) {
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return 0;
}
