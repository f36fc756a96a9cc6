// SPDX-License-Identifier: Apache-2.0
// The exact solver for small instances, the check on the MILP: enumerates every discrete choice
// (choice.h for_each_choice: paths, weight variants, homes) and solves each one's transfer LP with
// Clp — no branch and bound, no cuts, no heuristics, no integrality tolerances. Its optimum is the
// true optimum of the model; tests require the MILP to match it (tests/unit/plan/exact_test.cpp).
// Exponential in L: meant for L <= 6.
#pragma once

#include "core/result.h"
#include "plan/plan.h"
#include "plan/problem.h"

namespace ferry::plan {

struct ExactResult {
  Plan best;               // with solver.solver == "exact"
  long long choices = 0;   // discrete choices enumerated
  long long feasible = 0;  // of which some transfer schedule fits
};

// resource_exhausted when no choice fits; invalid_argument when L > max_layers (too many).
Result<ExactResult> solve_exact(const PlanProblem& p, int max_layers = 8);

}  // namespace ferry::plan
