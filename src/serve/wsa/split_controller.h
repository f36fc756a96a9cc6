// SPDX-License-Identifier: Apache-2.0
// The live MV-WSA decision rule: given the current split and fresh curves, move to the
// allocator's split only when it pays, so a stationary workload settles instead of oscillating.
// T's unavoidable part U (misses at every capacity: first accesses, prompt blocks never cached
// before, at E slots per layer and the whole budget in KV) is the same for every split; the
// relative thresholds below apply to the avoidable part T - U, so first-access misses early in a
// run (all of a session's first prefill) do not mask a gain.
// The target is allocate()'s split, or the best uniform split when that is within uniform_tie of
// it (T - U, curves dominated by prefill steps, where every slot of every layer saves about the
// same, make the allocator's per-layer caps a near-tie decided by noise: 8 and 79 slots where 43
// and 44 do as well; a balanced split is the robust choice among near-equals). A move is taken iff
//   gain = T(current) - T(target) >= band * (T(current) - U)          (relative threshold)
//   gain * horizon_steps >= migration_s                               (pays back its copies)
// where T is the modelled step time on the current curves and migration_s is the time to re-page
// what the move displaces: each slot a layer loses held a (resident) expert that may have to come
// back, each slot a layer gains is filled by a miss, so |delta slots| * expert_bytes / link; KV
// blocks move only when free (shrink) or are simply added (grow), costing nothing.
// The band is scaled by the curves' confidence: the gain is a difference of counts (the accesses
// and lookups whose stack depth lies between the two splits' capacities), so its standard error
// is about sqrt(sum over curves of cost^2 x |delta count|) / steps (Poisson), and
//   band = clamp(z x stderr / (T(current) - U), min_hysteresis, hysteresis)
// -- the full hysteresis on curves from a few steps, down to min_hysteresis once the gain is many
// standard errors clear of noise. (min_hysteresis >= hysteresis, or curve_steps unknown: the
// fixed band of the first version.)
// What this guarantees (tested in wsa_controller_test.cpp): every split it returns is feasible
// (budget, slot range, KV floor); when it keeps the current split, that split's T is within
// max(threshold_s, migration_s / horizon_steps) of the target's on the same curves, and the
// target's T - U within uniform_tie of the allocator's optimum's.
#pragma once

#include <cstdint>
#include <optional>

#include "serve/wsa/split_allocator.h"

namespace ferry::serve::wsa {

struct ControllerConfig {
  double hysteresis = 0.05;      // relative gain a move must promise (curves from few steps)
  double min_hysteresis = 0.01;  // ... once the gain is confidence_z standard errors clear
  double confidence_z = 3;
  double horizon_steps = 256;   // steps over which a move must repay its migration
  double link_bytes_per_s = 0;  // for migration_s (0: migration is free)
  double uniform_tie = 0.01;    // take the best uniform split within this of the allocator's
  bool of_avoidable = true;     // thresholds relative to T - U (false: to T, the first version)
  AllocatorOptions allocator;   // the allocator's (balance_tie: near-ties to balanced caps)
  // Price a recomputed prompt block at each split's own caps when the problem carries the
  // per-cap recompute misses (SplitProblem::recompute_misses): T is then
  // modelled_step_priced_by_caps_s everywhere below (target, current, uniform ties, U) and the
  // target comes from allocate_priced_by_caps with its live starts (PricedByCapsOptions:
  // every_uniform_start false, fixed_point_rounds 2). Off, or without those curves: allocate()
  // and modelled_step_s, the one price.
  bool price_by_caps = false;
};

struct Decision {
  Split target;          // the split it would move to on these curves
  double current_s = 0;  // modelled step time of the current split
  double target_s = 0;   // ... of the target
  double optimum_s = 0;  // ... of allocate()'s split (target_s <= optimum_s x (1 + uniform_tie))
  double migration_s = 0;
  double floor_s = 0;      // U: the part of T no split avoids
  double stderr_s = 0;     // standard error of current_s - target_s (0: unknown)
  double band = 0;         // the relative threshold applied (to current_s - floor_s)
  double threshold_s = 0;  // band x (current_s - floor_s): the gain a move must promise
  bool move = false;       // take target (else keep current)
};

// One live decision, for reports (LiveSplitStats::log, SimResult::log): when it was taken, what the
// controller saw and what it did.
struct DecisionRecord {
  std::uint64_t step = 0;  // engine / simulated step at which it was taken
  double current_s = 0, target_s = 0, migration_s = 0;
  double threshold = 0;  // the relative gain a move had to promise (Decision::band)
  bool move = false;     // the controller asked to move
  bool applied = false;  // ... and the pools were resized
  Split target;
};

// When a live controller decides, and how much its curves age in between (LiveSplit and the
// simulator's live policy share it). A fixed cadence of N steps wastes the first N steps at the
// starting split and reacts late to a shift; what matters is how much has been observed since
// the last decision, so the cadence counts expert accesses (the curves' samples):
//   decide iff steps since the last decision >= min_steps and
//              (mean accesses per MoE layer since then >= accesses_per_decision or
//               steps since then >= max_steps)
// A prefill step (every expert of a layer) brings a decision within a few steps; decode steps
// (a few dozen accesses each) space them out. Ageing is per step, not per decision, so the
// curves' memory does not depend on the cadence: after a decision every count is multiplied by
// age_per_64_steps ^ (steps since the last decision / 64).
struct CadenceConfig {
  int min_steps = 4;                   // never two decisions closer than this
  int max_steps = 64;                  // decide at least this often
  double accesses_per_decision = 256;  // mean expert accesses per MoE layer (2 E for E = 128)
  double age_per_64_steps = 0.9;       // curve weight kept per 64 steps
};

class DecisionCadence {
 public:
  explicit DecisionCadence(CadenceConfig cfg) : cfg_(cfg) {}
  // One step boundary; `accesses` = expert accesses recorded since the previous call, summed
  // over MoE layers, `layers` their number. True: decide now (then call decided()).
  bool step(double accesses, int layers);
  // The factor to age the curves by after this decision; resets the counters.
  double decided();
  const CadenceConfig& config() const { return cfg_; }

 private:
  CadenceConfig cfg_;
  int steps_ = 0;
  double accesses_ = 0;
};

class SplitController {
 public:
  explicit SplitController(ControllerConfig cfg) : cfg_(cfg) {}
  // current must have one entry per MoE layer of p. Errors: the allocator's.
  Result<Decision> decide(const SplitProblem& p, const Split& current) const;
  double migration_s(const SplitProblem& p, const Split& from, const Split& to) const;
  // Standard error of T(a) - T(b) on p's curves (0 when p.curve_steps is unknown).
  static double gain_stderr_s(const SplitProblem& p, const Split& a, const Split& b);
  // U: modelled step time at E slots in every layer and the whole KV curve (no split beats it).
  static double unavoidable_s(const SplitProblem& p);
  // Whether decide() prices a recomputed block by the caps on p (price_by_caps and p has the
  // curves), and the T it then judges a split by.
  bool priced_by_caps(const SplitProblem& p) const;
  double step_s(const SplitProblem& p, const Split& s) const;

 private:
  ControllerConfig cfg_;
};

}  // namespace ferry::serve::wsa
