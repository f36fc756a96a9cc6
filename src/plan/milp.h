// SPDX-License-Identifier: Apache-2.0
// Solving the schedule model (schedule_model.h):
//   solve_milp    the full MILP with COIN-OR CBC in-process (CbcMain: presolve, cuts,
//                 heuristics), wall-clock time-limited; the best incumbent is kept and the
//                 optimality gap reported when the limit stops the search.
//   solve_fixed   the binaries fixed to one discrete choice (homes + spans + kept internals) and
//                 the remaining LP (transfer assignment, exposure) solved by Clp: how fixed
//                 policies and the exact enumerator (exact.h) get the best transfer schedule for
//                 a given choice.
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
  // Stop when (incumbent - bound) / incumbent <= this (or the gap is <= 1e-7 ms). 1e-7 of the
  // step (0.3 us of a 3 s step) is far below what the model can tell apart, and it lets CBC stop
  // where the keep-internals binaries leave a gap of ~1e-5 ms in the move penalty's range that it
  // cannot close (3B / 7B at batch 32-64: the incumbent found in < 1 s, the rest of the time
  // limit spent on the proof). The tie-breaking penalty is then honoured to within that gap.
  double rel_gap = 1e-7;
  int log_level = 0;  // CBC's log level (0 quiet)
  // Also price the fixed policies (policies.h) the model admits and keep one if it beats CBC's
  // incumbent (possible only when the time limit stopped CBC); the plan then says "cbc+seed".
  bool seed_with_fixed_policies = true;
};

// resource_exhausted("plan: no plan fits ...") when infeasible; deadline_exceeded when the time
// limit passed without any feasible plan.
Result<Plan> solve_milp(const PlanProblem& p, const SolveOptions& o = {});

// keep: [L] kept internals, or empty: none (the fixed policies).
Result<Plan> solve_fixed(const PlanProblem& p, const std::vector<Home>& homes,
                         const std::vector<Span>& spans, const std::string& policy,
                         const std::vector<bool>& keep = {});

struct CapacityBound {
  double capacity_gb = 0;  // a capacity that fits (the incumbent)
  double bound_gb = 0;     // no smaller capacity fits (== capacity_gb when optimal)
  bool optimal = false;
};
Result<CapacityBound> min_capacity(const PlanProblem& p, Tier tier, const SolveOptions& o = {});

}  // namespace ferry::plan
