// SPDX-License-Identifier: Apache-2.0
// LiveSplit: MV-WSA while serving (`--split auto`). Attached to an Engine whose pager and KV pool
// are resizable (PagerConfig::resizable, KvConfig::max_budget_bytes), it
//   - feeds each layer call's distinct routed experts into that layer's StackDistance (executor
//     hook; one set per layer and step, as the pager acquires them: access_set),
//   - samples the engine's KV demand at every step boundary (Engine::kv_demand),
//   - with the prefix cache on, feeds the pool's block identities (KvCache::set_prefix_observer)
//     into a PrefixStackDistance: the prefix miss curve over KV capacity, priced at block_tokens
//     x the prefill cost per token (modelled per step from the pager's misses and the step's
//     tokens: step_base_s + misses x expert_bytes / link + prefill_token_s x tokens; a prefill
//     token costs what a full chunk of max_batch_tokens costs above a decode-only step,
//     demand.h), and its reuse prior (reuse_prior): the chains the pool holds now, plus the
//     blocks running and queued requests will hold (Engine::final_blocks), valued
//     before they come back,
//   - every decide_every_steps steps builds the SplitProblem (per-step curves, the floor raised to
//     the blocks in use and to the largest outstanding request), asks the SplitController, and on
//     a move calls Engine::resize_pools at that boundary (no draining), then ages the curves.
// Invariant, checked after every resize (a violation is a bug and aborts): expert slot bytes + KV
// block bytes <= budget_bytes, and KV blocks >= the configured floor.
// Tests: tests/unit/serve/wsa_live_test.cpp (outputs equal a fixed split's with forced resizes).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "serve/engine.h"
#include "serve/wsa/demand.h"
#include "serve/wsa/split_controller.h"

namespace ferry::serve::wsa {

struct LiveSplitConfig {
  std::size_t budget_bytes = 0;  // expert slots + KV blocks (the engine's pools)
  int concurrency = 4;           // admission floor = concurrency x max_context_tokens
  int max_context_tokens = 0;    // 0: the engine's max_seq_len (if bounded), else no floor
  // Cadence (split_controller.h DecisionCadence): decide once decide_accesses_per_expert x E
  // expert accesses per MoE layer arrived since the last decision, at least min_decide_steps and at
  // most decide_every_steps steps apart (decide_accesses_per_expert 0: every decide_every_steps
  // steps, the old fixed cadence); curves keep age_factor of their weight per 64 steps, whatever
  // the cadence. NOTE: ageing much faster than a prefill/decode phase makes the controller chase
  // phases (in serve_split_bench, decisions every 16 steps with 0.5 per decision moved 19 times and
  // lost 4 %; 0.9 per 64 steps held a good split). A fixed 64-step cadence, on the other hand,
  // spent the first 64 steps at the starting split (docs/serve_wsa.md).
  int decide_every_steps = 64;
  int min_decide_steps = 4;
  double decide_accesses_per_expert = 2;
  double age_factor = 0.9;  // curve weight kept per 64 steps
  // LiveSplit's step model, the simulator's (split_sim.h): a step costs
  //   step_base_s + prefill_token_s x tokens + misses x expert_bytes / link_bytes_per_s,
  // which prices a recomputed prompt token (demand.h PrefillCost: step_base_s cancels in a full
  // chunk's price above a decode-only step; it enters only the proportional fallback before
  // the first full chunk) and a KV block missing for a step (block_tokens x prefill_token_s).
  // A run scored by another step model should be priced by it: priced_by() below.
  double link_bytes_per_s = 24e9;
  double prefill_token_s = 2e-4;  // a missing KV block costs block_tokens x this per step
  double step_base_s = 0;
  // With the prefix cache: value cached chains that have not come back yet by the prefix
  // curve's reuse prior (prefix_curve.h), so early decisions do not give their blocks away.
  bool reuse_prior = true;
  // Keep decode steps on the device: every MoE layer's cap at least
  // decode_floor_slots(E, top_k, max_running, hot) (below), so a decode step of max_running
  // sequences always fits the device slot resolver (SlotResolver::fits: its distinct experts <=
  // cap - hot). Without it the split may take a layer below what a full decode step routes, and
  // those steps leave the device path and the CUDA graph for the host pager -- on the H100 in
  // session 36 live's caps of 29 (32 routed rows a step) cost 16.19 host syncs per decode step
  // against the configurator's 1.00, and live lost 8 % to it (docs/serve_wsa.md). On for the CUDA
  // engine (ferry serve --device cuda, serve_split_engine_bench); the CPU engine's resolver is a
  // twin with nothing to lose, so it keeps the plain floor (top-k + hot). Where the budget cannot
  // give every MoE layer that many slots next to the KV floor, the floor is the largest uniform
  // cap that fits (never below top-k + hot): the controller still decides, those steps take the
  // host path.
  bool decode_on_device = false;
  ControllerConfig controller;  // its link_bytes_per_s defaults to the one above
};

// A step model: step_s per step + token_s per token (prompt or decode) + miss_s per expert miss
// (the simulator's step_base_s / token_s / expert_bytes / link; serve_split_engine_bench's
// --model-step-ms / --model-miss-ms, which score its runs, with token_s 0).
struct StepModel {
  double step_s = 0, token_s = 0, miss_s = 0;
};

// `cfg` with LiveSplit's prices set to `m`: step_base_s = m.step_s, prefill_token_s = m.token_s,
// link_bytes_per_s = expert_bytes / m.miss_s (0, i.e. misses free, when m.miss_s <= 0), so the
// CostModel's miss cost is m.miss_s and the controller's migration (|delta slots| x expert_bytes
// / its link, which defaults to this link) is m.miss_s a slot. An explicit
// cfg.controller.link_bytes_per_s is kept.
// NOTE(#9): the engine bench scored its runs at 1.6 ms a step + 0.197 ms a miss but priced its
// LiveSplit at the default 0.2 ms a token and a 0.1716 ms miss (expert bytes / the scaled link):
// a recomputed prompt block at 4.17 ms where its scoring model pays 1.12 (docs/serve_wsa.md,
// session 29). Test: tests/unit/serve/wsa_profile_test.cpp (EngineProfileIsPricedByTheStepModel).
LiveSplitConfig priced_by(LiveSplitConfig cfg, const StepModel& m, std::size_t expert_bytes);

struct LiveSplitStats {
  std::uint64_t decisions = 0, moves = 0, forced = 0;
  // Decisions judged with the cap-dependent block price (ControllerConfig::price_by_caps on and
  // the problem carried the per-cap curves: has_cap_prices; 0 with it off).
  std::uint64_t priced_by_caps = 0;
  std::uint64_t refused = 0;        // decisions or resizes that could not be had (pools unchanged)
  std::size_t max_bytes = 0;        // largest expert + KV bytes seen after a resize
  int min_kv_blocks = -1;           // smallest KV block count seen after a resize
  std::vector<DecisionRecord> log;  // every decision, in order (reports)
  std::string last_refusal;         // why the last refused decision or resize was refused
  double decide_s = 0;              // host time in decisions (decision_problem + decide), all
};

class LiveSplit {
 public:
  // Installs the hooks; the engine must outlive this object (or be detached first).
  static Result<std::unique_ptr<LiveSplit>> attach(Engine& eng, const LiveSplitConfig& cfg);
  ~LiveSplit();
  // Applies `s` at the next step boundary (tests: forced resizes up and down).
  void force(Split s) { forced_ = std::move(s); }
  const Split& current() const { return current_; }
  const LiveSplitStats& stats() const { return stats_; }
  int kv_floor_blocks() const { return model_.kv_floor_blocks; }
  const CostModel& model() const { return model_; }
  // The problem on the curves as observed: a run's profile (the offline configurator's input,
  // serve_split_engine_bench's fixed-50 run) and reports. No reuse prior: that is a forecast of
  // lookups still to come, which a finished run's curve already holds (it saw every lookup).
  // NOTE(#9): until 2026-12-06 this was the decision problem, prior included, and the engine
  // bench's profile carried it: at the end of the phased 12 x 6 run all 12 final histories are
  // released and pending, so the prior added p x W = 0.82 x 3,565 lookups at depth 3,565 (0.44
  // missing blocks per step below 3,565 blocks) for sessions that never came back, and the
  // configurator bought 3,631 blocks to keep them (22-23 slots per layer; 0.937x the best fixed
  // run; docs/serve_wsa.md, session 29). The simulator's profile never had the prior.
  SplitProblem problem(const Engine& eng) const;
  // What the controller decides on: problem() plus, with LiveSplitConfig::reuse_prior and the
  // prefix cache, the prefix curve's reuse prior for the chains held and pending now.
  SplitProblem decision_problem(const Engine& eng) const;

 private:
  LiveSplit(Engine& eng, const LiveSplitConfig& cfg) : eng_(eng), cfg_(cfg), ctl_(cfg.controller) {}
  Status on_step(Engine& eng);
  Status apply(Engine& eng, const Split& s);
  void sync();  // current_ := what the engine's pools hold

  void observe_step_cost(const Engine& eng);  // PrefillCost from the last step's counters
  SplitProblem problem(const Engine& eng, bool reuse_prior) const;

  Engine& eng_;
  LiveSplitConfig cfg_;
  SplitController ctl_;
  CostModel model_;
  std::vector<int> moe_layers_;     // engine layer of each split entry
  std::vector<int> layer_index_;    // [L] split entry of an engine layer, -1 dense
  std::vector<StackDistance> sd_;   // [L_moe]
  std::vector<std::uint8_t> seen_;  // [E] scratch of the access hook
  std::vector<int> distinct_;       // [<= E] ... the layer call's distinct experts
  std::vector<std::pair<int, int>> order_;
  KvDemand kv_;
  std::unique_ptr<PrefixStackDistance> prefix_;  // with the engine's prefix cache only
  PrefillCost prefill_cost_;
  PrefillCost prefill_base_cost_;  // the same steps without their misses (the price's base)
  ChunkMisses chunks_;             // full chunks' and decode steps' misses at every cap
  std::uint64_t last_misses_ = 0, last_prefill_ = 0, last_decode_ = 0;
  double steps_ = 0;
  DecisionCadence cadence_{CadenceConfig{}};
  double step_accesses_ = 0;  // expert accesses (all MoE layers) since the last step boundary
  Split current_;
  std::optional<Split> forced_;
  LiveSplitStats stats_;
};

// The smallest per-layer cap at which a decode step of `max_running` sequences always fits the
// device resolver: min(E, max_running x top_k + hot) (its distinct experts, at most
// max_running x top_k, fit cap - hot).
int decode_floor_slots(int experts, int top_k, int max_running, int hot);

// The split a resizable engine starts from: experts get `expert_fraction` of the budget as a
// uniform cap (at least top-k), the KV pool the rest (at least the floor).
struct InitialSplit {
  std::vector<int> caps;  // [L], 0 for dense layers
  std::size_t kv_bytes = 0;
};
Result<InitialSplit> initial_split(const model::DecoderGeometry& geo, std::size_t expert_bytes,
                                   std::size_t kv_block_bytes, std::size_t budget_bytes,
                                   int kv_floor_blocks, double expert_fraction = 0.5);

// Makes `ec` a resizable engine for --split auto: paged experts with resizable caps, KV pool
// resizable up to the budget with on-demand growth and preemption, one device budget of
// `budget_bytes`, starting from the 50/50 split (initial_split).
Status configure_auto_split(const model::DecoderGeometry& geo, std::size_t budget_bytes,
                            int kv_floor_blocks, EngineConfig& ec);
// ... starting from `start` instead of 50/50: a warm start, e.g. the offline configurator's split
// of a recorded routing trace (`ferry serve --split auto --trace FILE`), so the first steps do
// not run at 50/50 until the controller has seen enough to move (in the simulator, live from the
// configurator's split of the run's own profile is 0.3-2.0 % faster than live from 50/50;
// docs/serve_wsa.md). start.slots: one cap per MoE layer in layer order, each in [top-k, E];
// start.kv_blocks >= kv_floor_blocks; its bytes (the engine's expert and block sizes) within
// budget_bytes. Otherwise invalid_argument naming what does not fit, and `ec` is unchanged.
Status configure_auto_split(const model::DecoderGeometry& geo, std::size_t budget_bytes,
                            int kv_floor_blocks, const Split& start, EngineConfig& ec);

}  // namespace ferry::serve::wsa
