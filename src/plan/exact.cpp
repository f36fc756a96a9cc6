// SPDX-License-Identifier: Apache-2.0
#include "plan/exact.h"

#include <chrono>
#include <limits>

#include "plan/choice.h"
#include "plan/evaluate.h"
#include "plan/osi_model.h"
#include "plan/schedule_model.h"

namespace ferry::plan {

Result<ExactResult> solve_exact(const PlanProblem& p, int max_layers) {
  FERRY_TRY(validate(p));
  if (p.num_layers > max_layers) {
    return invalid_argument("plan: exact solver limited to {} layers, problem has {}", max_layers,
                            p.num_layers);
  }
  const auto t0 = std::chrono::steady_clock::now();
  ScheduleModel sm(p);
  auto osi = detail::make_osi(sm.model());
  const int cols = sm.model().num_cols();
  ExactResult r;
  double best = std::numeric_limits<double>::infinity();
  std::vector<double> best_sol;
  r.choices = for_each_choice(p, [&](const Choice& c) {
    sm.fix_choice(c.homes, c.spans);
    const LinearModel& m = sm.model();
    for (int col = 0; col < cols; ++col) {
      if (m.integer[col]) osi->setColBounds(col, m.col_lb[col], m.col_ub[col]);
    }
    osi->initialSolve();
    if (!osi->isProvenOptimal()) return;
    ++r.feasible;
    const double obj = osi->getObjValue() + m.obj_constant;
    if (obj < best) {
      best = obj;
      const double* x = osi->getColSolution();
      best_sol.assign(x, x + cols);
    }
  });
  if (best_sol.empty()) {
    return resource_exhausted("plan: exact: none of {} choices fits (batch {})", r.choices,
                              p.batch_size);
  }
  r.best = sm.extract_plan(best_sol);
  r.best.policy = "exact";
  r.best.solver.solver = "exact";
  r.best.solver.status = "optimal";
  r.best.solver.objective_ms = best;
  r.best.solver.bound_ms = best;
  r.best.solver.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  FERRY_ASSIGN_OR_RETURN(r.best.predicted, evaluate(p, r.best));
  return r;
}

}  // namespace ferry::plan
