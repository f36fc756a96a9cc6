// SPDX-License-Identifier: Apache-2.0
// Solving the schedule model (schedule_model.h):
//   solve_milp    the full MILP with COIN-OR CBC in-process (CbcMain: presolve, cuts,
//                 heuristics), wall-clock time-limited; the best incumbent is kept and the
//                 optimality gap reported when the limit stops the search.
//   solve_fixed   the binaries fixed to one discrete choice (homes + spans) and the remaining LP
//                 (transfer assignment, exposure) solved by Clp: how fixed policies and the exact
//                 enumerator (exact.h) get the best transfer schedule for a given choice.
//   min_capacity  the smallest capacity of one tier for which some plan fits the other tiers
//                 (an MILP whose objective is that capacity).
// Every returned Plan carries the evaluator's Prediction (evaluate.h), not the solver's numbers.
// Not thread-safe: CbcMain keeps global state; call from one thread.
#pragma once

#include <string>
#include <vector>

#include "core/result.h"
#include "plan/plan.h"
#include "plan/problem.h"
#include "plan/schedule_model.h"

namespace ferry::plan {

struct SolveOptions {
  double time_limit_s = 30;  // wall clock
  double rel_gap = 1e-9;     // stop when (incumbent - bound) / incumbent <= this
  int log_level = 0;         // CBC's log level (0 quiet)
  // Also price the fixed policies (policies.h) the model admits and keep one if it beats CBC's
  // incumbent (possible only when the time limit stopped CBC); the plan then says "cbc+seed".
  bool seed_with_fixed_policies = true;
};

// resource_exhausted("plan: no plan fits ...") when infeasible; deadline_exceeded when the time
// limit passed without any feasible plan.
Result<Plan> solve_milp(const PlanProblem& p, const SolveOptions& o = {});

Result<Plan> solve_fixed(const PlanProblem& p, const std::vector<Home>& homes,
                         const std::vector<Span>& spans, const std::string& policy);

struct CapacityBound {
  double capacity_gb = 0;  // a capacity that fits (the incumbent)
  double bound_gb = 0;     // no smaller capacity fits (== capacity_gb when optimal)
  bool optimal = false;
};
Result<CapacityBound> min_capacity(const PlanProblem& p, Tier tier, const SolveOptions& o = {});

}  // namespace ferry::plan
