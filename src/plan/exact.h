// SPDX-License-Identifier: Apache-2.0
// The exact solver for small instances, the check on the MILP: enumerates every discrete choice
// (choice.h for_each_choice: paths, weight variants, homes; and every subset of the layers whose
// internals may be kept, skipping the supersets of a subset that does not fit: kept internals
// only add memory), solves each one's transfer LP with Clp — no branch and bound, no cuts, no
// heuristics, no integrality tolerances — and prices the resulting plan with the evaluator
// (evaluate.h: step time incl. the CPU optimizer's gate, walked window by window), keeping the
// cheapest. Host and NVMe memory (no window: the executor holds them for the whole run) are
// checked per choice by its own sum, not by the LP's rows. Its optimum is the true optimum of the
// model; tests require the MILP to match it (tests/unit/plan/milp_exact_test.cpp), and every
// choice's LP objective to equal the evaluator's price (max_lp_mismatch_ms).
// Exponential in L (x 2^L with keep choices): meant for L <= 6.
#pragma once

#include "core/result.h"
#include "plan/plan.h"
#include "plan/problem.h"

namespace ferry::plan {

struct ExactResult {
  Plan best;               // with solver.solver == "exact"
  long long paths = 0;     // choices of homes and spans (for_each_choice)
  long long choices = 0;   // discrete choices solved: paths x the keep subsets searched
  long long feasible = 0;  // of which some transfer schedule fits
  // Paths whose homes exceed the host or NVMe capacity (not solved): those tiers have no window,
  // so the exact solver checks them itself (host: the model state, the host homes and the NVMe
  // bounce buffer when any boundary is on NVMe) and relaxes the LP's rows for them.
  long long over_static_tiers = 0;
  // Largest |LP objective - evaluator objective| over the feasible choices (ms): 0 up to solver
  // tolerances when the LP's rows price a schedule as the evaluator does.
  double max_lp_mismatch_ms = 0;
};

// resource_exhausted when no choice fits; invalid_argument when L > max_layers (too many).
Result<ExactResult> solve_exact(const PlanProblem& p, int max_layers = 8);

}  // namespace ferry::plan
