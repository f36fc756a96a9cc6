// SPDX-License-Identifier: Apache-2.0
#include "plan/compare.h"

#include <map>

#include "plan/policies.h"

namespace ferry::plan {

Result<Comparison> compare_policies(const ProblemAt& problem_at, int batch,
                                    const CompareOptions& o) {
  Comparison c;
  c.batch = batch;
  FERRY_ASSIGN_OR_RETURN(PlanProblem at_batch, problem_at(batch));
  const BatchSearchOptions search{.max_batch = o.max_batch, .require_low_exposure = false};

  // Keeps a plan when it fits; "does not fit" leaves the optional empty.
  const auto keep = [](Result<Plan> r, std::optional<Plan>& out) -> Status {
    if (r.ok()) {
      out = std::move(r).value();
      return ok_status();
    }
    const StatusCode code = r.status().code();
    if (code == StatusCode::kResourceExhausted || code == StatusCode::kDeadlineExceeded) {
      return ok_status();
    }
    return std::move(r).take_status();
  };
  const auto fill_largest = [&](PolicyRow& row, const Planner& planner) -> Status {
    Result<BatchSearchResult> r = largest_batch(problem_at, planner, search);
    if (r.ok()) {
      row.largest_batch = r->largest_fitting;
      row.at_largest = std::move(r->plan);
      return ok_status();
    }
    if (r.status().code() == StatusCode::kResourceExhausted) return ok_status();
    return std::move(r).take_status();
  };

  const Planner planner =
      o.planner ? o.planner : [&](const PlanProblem& p) { return solve_milp(p, o.solve); };
  const Planner probe_planner = o.probe_planner ? o.probe_planner : [&](const PlanProblem& p) {
    return solve_milp(p, o.probe_solve);
  };
  // The full planner's plan at a batch, solved once per batch: the rows below ask it at each
  // policy's largest batch, often the same one (ferry plan's search over resident layers makes
  // each solve ~15 s at 3B). problem_at gives the same problem for the same batch.
  std::map<int, std::optional<Plan>> solved_by_batch;
  const auto solved_at = [&](int b, std::optional<Plan>& out) -> Status {
    auto it = solved_by_batch.find(b);
    if (it == solved_by_batch.end()) {
      FERRY_ASSIGN_OR_RETURN(PlanProblem p, problem_at(b));
      std::optional<Plan> plan;
      FERRY_TRY(keep(planner(p), plan));
      it = solved_by_batch.emplace(b, std::move(plan)).first;
    }
    out = it->second;
    return ok_status();
  };
  PolicyRow solved{.policy = "solved"};
  if (o.solved_at_batch != nullptr) {
    solved.at_batch = *o.solved_at_batch;
  } else {
    FERRY_TRY(keep(planner(at_batch), solved.at_batch));
  }
  solved_by_batch.emplace(batch, solved.at_batch);
  FERRY_TRY(fill_largest(solved, probe_planner));
  // The probes find the largest fitting batch (ferry plan probes at K = 0 resident layers: any K
  // fits only where K = 0 does); the plan shown there is the full planner's.
  if (solved.at_largest && o.planner) FERRY_TRY(solved_at(solved.largest_batch, solved.at_largest));
  c.rows.push_back(std::move(solved));

  for (const FixedPolicy& pol : fixed_policies(at_batch.num_layers, o.checkpoint_k)) {
    PolicyRow row{.policy = pol.name};
    FERRY_TRY(keep(solve_policy(at_batch, pol), row.at_batch));
    FERRY_TRY(fill_largest(row, [&](const PlanProblem& p) { return solve_policy(p, pol); }));
    if (row.at_largest) FERRY_TRY(solved_at(row.largest_batch, row.solved_at_largest));
    c.rows.push_back(std::move(row));
  }
  return c;
}

Json to_json(const Comparison& c) {
  const auto summary = [](const Plan& p) {
    return Json{{"batch_size", p.batch_size},
                {"step_ms", p.predicted.step_ms},
                {"gpu_step_ms", p.predicted.gpu_step_ms},
                {"exposed_ms", p.predicted.exposed_ms},
                {"optimizer_wait_ms", p.predicted.optimizer_wait_ms},
                {"optimizer_bound_ms", p.predicted.optimizer_bound_ms},
                {"host_home_ms", p.predicted.host_home_ms},
                {"recompute_ms", p.predicted.recompute_ms},
                {"tflops", p.predicted.tflops},
                {"gpu_peak_gb", p.predicted.gpu_peak_gb},
                {"host_peak_gb", p.predicted.host_peak_gb},
                {"solver_status", p.solver.status},
                {"gap", p.solver.gap}};
  };
  Json rows = Json::array();
  for (const PolicyRow& r : c.rows) {
    Json row = {{"policy", r.policy}, {"largest_batch", r.largest_batch}};
    row["at_batch"] = r.at_batch ? summary(*r.at_batch) : Json(nullptr);
    row["at_largest_batch"] = r.at_largest ? summary(*r.at_largest) : Json(nullptr);
    if (r.policy != "solved") {
      row["solved_at_same_batch"] =
          r.solved_at_largest ? summary(*r.solved_at_largest) : Json(nullptr);
    }
    rows.push_back(row);
  }
  return {{"batch_size", c.batch}, {"policies", rows}};
}

}  // namespace ferry::plan
