// SPDX-License-Identifier: Apache-2.0
// The two planners the searches' property tests run (search_resident, search_device_tail): the
// exact solver (its optimum as the plan's objective) and the MILP (30 s limit).
#pragma once

#include <utility>

#include "plan/exact.h"
#include "plan/milp.h"
#include "plan/resident.h"

namespace ferry::plan::testing {

inline Planner exact_planner() {
  return [](const PlanProblem& q) -> Result<Plan> {
    FERRY_ASSIGN_OR_RETURN(ExactResult e, solve_exact(q));
    e.best.predicted.objective_ms = e.best.solver.objective_ms;
    return std::move(e.best);
  };
}

inline Planner milp_planner() {
  return [](const PlanProblem& q) { return solve_milp(q, SolveOptions{.time_limit_s = 30}); };
}

}  // namespace ferry::plan::testing
