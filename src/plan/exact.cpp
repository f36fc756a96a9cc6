// SPDX-License-Identifier: Apache-2.0
#include "plan/exact.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

#include "core/check.h"
#include "plan/choice.h"
#include "plan/evaluate.h"
#include "plan/osi_model.h"
#include "plan/schedule_model.h"

namespace ferry::plan {
namespace {

// The tiers no window touches, checked per choice here rather than by the LP (whose host and NVMe
// rows solve_exact relaxes), so that the exact solver states the memory rules of docs/plan.md a
// second time: host memory holds the model state, the host-homed boundaries and, once any
// boundary's home is NVMe, the executor's one bounce buffer (nvme_bounce_gb) for the whole run;
// NVMe holds the NVMe-homed boundaries.
bool static_tiers_fit(const PlanProblem& p, const std::vector<Home>& homes) {
  double host = p.host_fixed_gb, nvme = 0;
  bool on_nvme = false;
  for (int i = 0; i < p.num_layers; ++i) {
    if (homes[i] == Home::kHost) host += p.boundary_gb[i];
    if (homes[i] == Home::kNvme) {
      nvme += p.boundary_gb[i];
      on_nvme = true;
    }
  }
  if (on_nvme) host += nvme_bounce_gb(p);
  return host <= p.host_cap_gb + kGbTolerance && nvme <= p.nvme_cap_gb + kGbTolerance;
}

}  // namespace

Result<ExactResult> solve_exact(const PlanProblem& p, int max_layers) {
  FERRY_TRY(validate(p));
  if (p.num_layers > max_layers) {
    return invalid_argument("plan: exact solver limited to {} layers, problem has {}", max_layers,
                            p.num_layers);
  }
  const auto t0 = std::chrono::steady_clock::now();
  ScheduleModel sm(p);
  auto osi = detail::make_osi(sm.model());
  for (int row : {sm.host_row(), sm.nvme_row()}) {
    if (row >= 0) osi->setRowUpper(row, osi->getInfinity());  // static_tiers_fit checks them
  }
  const int cols = sm.model().num_cols();
  ExactResult r;
  double best = std::numeric_limits<double>::infinity();
  // One discrete choice: homes and spans from for_each_choice, kept internals from the search
  // below. Returns whether its LP is feasible.
  std::vector<bool> keep(p.num_layers, false);
  const auto solve_choice = [&](const Choice& c) {
    ++r.choices;
    sm.fix_choice(c.homes, c.spans, keep);
    const LinearModel& m = sm.model();
    for (int col = 0; col < cols; ++col) {
      if (m.integer[col]) osi->setColBounds(col, m.col_lb[col], m.col_ub[col]);
    }
    osi->initialSolve();
    if (!osi->isProvenOptimal()) return false;
    ++r.feasible;
    // The choice is priced by the evaluator (the step walked window by window, the optimizer gate
    // as a recursion), not by the LP's objective: the LP only supplies the transfer schedule.
    const double* x = osi->getColSolution();
    Plan plan = sm.extract_plan(std::vector<double>(x, x + cols));
    Result<Prediction> pred = evaluate(p, plan);
    FERRY_CHECK(pred.ok(), "plan: exact: the LP's schedule is malformed: {}",
                pred.status().to_string());
    const double lp = osi->getObjValue() + m.obj_constant;
    r.max_lp_mismatch_ms = std::max(r.max_lp_mismatch_ms, std::abs(lp - pred->objective_ms));
    if (pred->objective_ms < best) {
      best = pred->objective_ms;
      plan.predicted = *pred;
      r.best = std::move(plan);
    }
    return true;
  };
  // Every subset of the layers with a keep choice, each once (layers added in increasing order).
  // A subset whose LP is infeasible is not extended: kept internals only add GPU memory (their
  // time terms meet only free columns: eps, wait, bound), so every superset is infeasible too.
  const std::function<void(const Choice&, int)> keep_subsets = [&](const Choice& c, int from) {
    if (!solve_choice(c)) return;
    for (int j = from; j < p.num_layers; ++j) {
      if (!keep_allowed(p, j)) continue;
      keep[j] = true;
      keep_subsets(c, j + 1);
      keep[j] = false;
    }
  };
  r.paths = for_each_choice(p, [&](const Choice& c) {
    if (!static_tiers_fit(p, c.homes)) {
      ++r.over_static_tiers;
      return;
    }
    keep_subsets(c, 0);
  });
  if (r.feasible == 0) {
    return resource_exhausted("plan: exact: none of {} choices fits (batch {})", r.choices,
                              p.batch_size);
  }
  r.best.policy = "exact";
  r.best.solver.solver = "exact";
  r.best.solver.status = "optimal";
  r.best.solver.objective_ms = best;
  r.best.solver.bound_ms = best;
  r.best.solver.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace ferry::plan
