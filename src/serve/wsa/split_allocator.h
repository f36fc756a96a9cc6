// SPDX-License-Identifier: Apache-2.0
// The MV-WSA allocator (serve.md item 6 and "MV-WSA"): divides one byte budget between expert
// slots (one cap per MoE layer; caps may differ) and KV blocks, minimising the modelled step time
//   T = miss_cost_s * sum_l m_l(C_l) + kv_block_cost_s * s(k) + prefix_block_cost_s * r(k)
// subject to sum_l C_l * expert_bytes + k * kv_block_bytes <= budget, min_slots <= C_l <= E and
// k >= kv_floor_blocks. m_l is layer l's LRU miss curve (misses per step at capacity C, from
// StackDistance), s the KV shortage curve (blocks missing per step, convex_curve.h) and r the
// prefix cache's miss curve (prompt blocks not found cached per step, prefix_curve.h; empty
// without a prefix cache): cached-but-unreferenced blocks are reclaimable, and what more KV
// capacity buys is the prefill they save. The KV side is one curve, their weighted sum.
// Method: every curve is convexified; starting from the minimum allocation, the hull segment with
// the largest latency saved per byte is taken next (whole segments, so each curve stays on a
// hull vertex, where hull == curve), a segment that no longer fits is taken partly and closes its
// curve. The marginal savings per byte are then (up to one quantum) equal across pools, the
// optimum of the convexified problem. Because the real curves are not convex and quanta are
// whole, the result is then polished on the real curves: single-quantum exchanges between pools
// while one lowers T, and every uniform split (the fixed-split family) is a candidate too.
// Balanced ties (AllocatorOptions::balance_tie): on nearly linear curves (live curves of a few
// prefill steps: every slot of every layer saves about one miss) a layer's hull is one long
// segment, and taking whole segments by rate hands them to whichever layer's rate is a hair
// higher -- corner splits (13..95 slots per layer) whose T equals a balanced split's. So while
// the best segment is a MoE layer's, every MoE layer whose segment rate is within balance_tie
// (relative) of it is a tie: the greedy then takes one slot at a time, to the tied layer with the
// fewest slots. Every quantum taken saves at least (1 - balance_tie) x the best rate then on
// offer, so on convex curves the greedy's T is within balance_tie x (T(minimum split) - T(opt))
// of the optimum (exact with balance_tie = 0, the plain greedy). The polish moves a slot between
// layers only when the receiving layer saves more than (1 + balance_tie) x what the giving layer
// loses, so it does not undo the balance on (near-)ties either.
// Tests: tests/unit/serve/wsa_allocator_test.cpp (budget, floor, <= every fixed split, greedy
// within one segment of the brute-force optimum), wsa_allocator_balance_test.cpp (balanced caps
// on ties, real differences kept, the tolerance bound).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/result.h"

namespace ferry::serve::wsa {

struct SplitProblem {
  std::size_t budget_bytes = 0;                    // expert slots + KV blocks together
  std::size_t expert_bytes = 0;                    // one expert slot
  std::size_t kv_block_bytes = 0;                  // one KV block (all layers, K and V)
  int min_slots = 1;                               // per MoE layer (top-k plus hot experts)
  std::vector<std::vector<double>> expert_misses;  // [L_moe][E+1] misses per step at capacity C
  std::vector<double> kv_short;  // [max_blocks+1] KV blocks missing per step at k blocks
  int kv_floor_blocks = 0;       // admission floor: concurrency x max context, in blocks
  double miss_cost_s = 0;        // one expert miss: expert_bytes / link bandwidth
  double kv_block_cost_s = 0;    // one block missing for one step (recompute or queueing)
  // Prefix cache: [<= max_blocks+1] prompt blocks missing per step at k blocks (the last entry
  // holds beyond its end; empty: no prefix cache), and the prefill one missing block costs.
  std::vector<double> kv_prefix_misses;
  double prefix_block_cost_s = 0;
  // The (aged) steps the per-step curves were averaged over: curve x curve_steps ~ the counts
  // behind it, which the live controller uses for the standard error of a gain (0: unknown).
  double curve_steps = 0;
  // Optional, for allocate_priced_by_caps() (empty: a recomputed block costs
  // prefix_block_cost_s at every split): a recomputed prompt block's expert misses per MoE layer
  // at each cap ([L_moe][E+1], ChunkMisses::per_block in demand.h), so at caps C it costs
  //   prefix_block_base_s + miss_cost_s x sum_l recompute_misses[l][C_l]
  // (the base: what is not misses, e.g. per-token time); prefix_misses_seen: the prompt blocks
  // per step the profiled run itself recomputed, whose misses its expert curves already count
  // at its own caps.
  std::vector<std::vector<double>> recompute_misses;
  double prefix_block_base_s = 0;
  double prefix_misses_seen = 0;
  int experts() const {
    return expert_misses.empty() ? 0 : static_cast<int>(expert_misses[0].size()) - 1;
  }
  int kv_max_blocks() const { return static_cast<int>(kv_short.size()) - 1; }
  // Field by field (a saved profile loads back equal: split_profile.h).
  friend bool operator==(const SplitProblem&, const SplitProblem&) = default;
};

struct Split {
  std::vector<int> slots;  // [L_moe] expert slots per MoE layer
  int kv_blocks = 0;
  std::size_t bytes(const SplitProblem& p) const;
  friend bool operator==(const Split&, const Split&) = default;
};

// "slots/layer lo..hi (mean m), kv k blocks" (reports, logs).
std::string to_string(const Split& s);

// The KV side of T at k blocks: shortage plus prefix-cache misses, each at its cost.
double kv_side_s(const SplitProblem& p, int k);
// ... with a recomputed prompt block priced at prefix_block_cost_s instead of p's price.
double kv_side_s(const SplitProblem& p, int k, double prefix_block_cost_s);
// The modelled step time of a split on the problem's (real, not convexified) curves.
double modelled_step_s(const SplitProblem& p, const Split& s);
// ... with a recomputed prompt block priced at prefix_block_cost_s instead of p's price (the
// same sums in the same order: equal to the bit to modelled_step_s on a copy of p at that price).
double modelled_step_s(const SplitProblem& p, const Split& s, double prefix_block_cost_s);
// Whether a split respects the budget, the slot range and the KV floor.
bool feasible(const SplitProblem& p, const Split& s);

// The fixed split with `cap` slots in every MoE layer and every remaining byte in KV blocks
// (capped at the curve's end); infeasible (resource_exhausted) if the KV floor no longer fits.
Result<Split> uniform_split(const SplitProblem& p, int cap);
// Every feasible uniform split, cap = min_slots..E (the oracle searches these exhaustively).
std::vector<Split> all_uniform_splits(const SplitProblem& p);
// The fixed split giving experts `expert_fraction` of the budget (rounded down to a uniform cap,
// clamped to the feasible range).
Result<Split> fraction_split(const SplitProblem& p, double expert_fraction);

struct AllocatorOptions {
  // Relative tolerance within which MoE layers' saving-per-byte rates count as a tie, broken
  // towards the layer with the fewest slots (0: the plain greedy, ties to the highest index).
  // 1e-3: far below what live curves resolve -- a rate is a count of accesses between two stack
  // depths, and telling two rates 0.1 % apart takes ~10^7 counts each (Poisson, 3 standard
  // errors), where a live curve holds 10^2..10^5 -- and far below the controller's own tie and
  // band (uniform_tie and min_hysteresis, 1 % of T - U), so the T it may give up (at most
  // 1e-3 x the avoidable part, file comment) is invisible to every rule downstream.
  double balance_tie = 1e-3;
};

// Whether p can price a recomputed block by the caps: it has per-cap recompute curves and a
// prefix curve (else every cap-priced function below is its one-price twin).
inline bool has_cap_prices(const SplitProblem& p) {
  return !p.recompute_misses.empty() && !p.kv_prefix_misses.empty();
}
// The price of a recomputed prompt block at split s: prefix_block_base_s + miss_cost_s x
// sum_l recompute_misses[l][s.slots[l]] (p.prefix_block_cost_s without recompute_misses).
double prefix_block_cost_at(const SplitProblem& p, const Split& s);
// The modelled step time with the block priced at s's own caps: modelled_step_s() at that price,
// with the profiled run's own recomputed blocks (prefix_misses_seen) priced at the profile's
// price, not at s's (their misses are in the expert curves already):
//   T(s) = modelled_step_s(p at price(s), s)
//          - prefix_misses_seen x (price(s) - prefix_block_cost_s),
// = modelled_step_s(p, s) without recompute_misses, and at a split whose price is the profile's.
double modelled_step_priced_by_caps_s(const SplitProblem& p, const Split& s);

// allocate() with a price that depends on the caps (NOTE(#9), docs/serve_wsa.md "The engine
// bench's LiveSplit priced by its step model"): T has a term r(k) x price(C), in both pools,
// which the separable greedy cannot take. Iterating price -> allocate -> reprice converges to the
// nearest self-consistent split (on the phased 12 x 6 profile 25 slots: a block is worth 1.11 ms
// there, and 1.11 ms keeps 25 slots), while 36-37 slots are self-consistent too and faster. So
// this is a multi-start: allocate() at p's own price, up to 8 rounds of that iteration from its
// split, and allocate() at the price of every uniform split; each candidate (and each uniform
// split) judged by modelled_step_priced_by_caps_s; ties keep the first (allocate(p)'s split), so
// the result is never worse by that T than allocate(p), the iteration or any uniform split.
// Without recompute_misses (or a prefix curve): allocate(p). About E + 9 allocations.
// The live controller's variant (PricedByCapsOptions::every_uniform_start false): the same, but
// allocate() only at the price of the uniform split that is best by that T (one start instead
// of E: the far optimum lies next to the best uniform split where there is one) and up to
// fixed_point_rounds rounds; never worse than allocate(p), its iterates or any uniform split
// either. About 3 + rounds allocations.
struct PricedByCapsOptions {
  int fixed_point_rounds = 8;       // price -> allocate -> reprice rounds from allocate(p)
  bool every_uniform_start = true;  // allocate() at every uniform split's price, else the best's
};
Result<Split> allocate_priced_by_caps(const SplitProblem& p, const AllocatorOptions& opt = {},
                                      const PricedByCapsOptions& starts = {});

// The offline configurator, one entry point for `ferry serve --plan-only` (trace_plan.h) and the
// benches' configurator (serve_split_bench "mv-wsa offline", serve_split_engine_bench
// "configurator"): allocate_priced_by_caps(p, opt) when price_by_caps (the default of all three
// since session 30, --configurator-price-by-caps on), else allocate(p, opt) at p's one price.
// Without cap prices (has_cap_prices(p) false) both give allocate(p, opt)'s split.
Result<Split> offline_split(const SplitProblem& p, bool price_by_caps,
                            const AllocatorOptions& opt = {});

// The marginal-value greedy on convexified curves alone (no polish), for tests.
Result<Split> greedy_on_hulls(const SplitProblem& p, const AllocatorOptions& opt = {});
// greedy_on_hulls, then polished on the real curves (see the file comment).
Result<Split> allocate(const SplitProblem& p, const AllocatorOptions& opt = {});

}  // namespace ferry::serve::wsa
