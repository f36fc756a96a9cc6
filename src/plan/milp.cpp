// SPDX-License-Identifier: Apache-2.0
// CBC and Clp drivers for the schedule model.
#include "plan/milp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>

#include <fmt/format.h>

#include <coin/CbcModel.hpp>
#include <coin/CbcSolver.hpp>

#include "plan/evaluate.h"
#include "plan/osi_model.h"
#include "plan/policies.h"

namespace ferry::plan {
namespace {

struct CbcOutcome {
  bool has_solution = false;
  bool optimal = false;
  bool infeasible = false;
  bool time_limit = false;
  std::vector<double> sol;
  double objective = 0;  // incl. the model's constant
  double bound = 0;
  double seconds = 0;
};

int no_callback(CbcModel*, int) { return 0; }

// objective_floor: a lower bound on the whole objective (incl. the model's constant), the scale of
// the absolute gap below.
CbcOutcome run_cbc(const LinearModel& m, const SolveOptions& o, double objective_floor) {
  const auto t0 = std::chrono::steady_clock::now();
  auto osi = detail::make_osi(m);
  CbcModel model(*osi);
  CbcSolverUsefulData data;
  data.noPrinting_ = o.log_level == 0;
  CbcMain0(model, data);
  model.setLogLevel(o.log_level);
  // CbcMain's own parser: wall-clock limit, gaps, quiet, solve. Strings outlive the call.
  const std::string seconds = std::to_string(std::max(0.01, o.time_limit_s));
  // {:g}: std::to_string prints 6 decimals, which made any gap below 5e-7 "0.000000".
  const std::string ratio = fmt::format("{:g}", o.rel_gap);
  // CBC's ratio gap is relative to its own objective, which leaves out the model's constant (the
  // step's fixed part: most of a 3B step), so rel_gap of the whole objective is also given as an
  // absolute gap: rel_gap x a lower bound on the whole objective.
  const std::string absolute =
      fmt::format("{:g}", std::max(1e-7, o.rel_gap * std::max(0.0, objective_floor)));
  const std::string log = std::to_string(o.log_level);
  const char* argv[] = {"ferry-plan",     "-timeMode", "elapsed",     "-seconds",
                        seconds.c_str(),  "-ratioGap", ratio.c_str(), "-allowableGap",
                        absolute.c_str(), "-log",      log.c_str(),   "-solve",
                        "-quit"};
  CbcMain1(static_cast<int>(std::size(argv)), argv, model, no_callback, data);

  CbcOutcome r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.optimal = model.isProvenOptimal() && model.bestSolution() != nullptr;
  // CBC's status flags are not trusted when the clock ran out early: a CI run under sanitizers
  // reported "no plan fits" for an instance where fixed policies fit, i.e. CBC stopped inside
  // preprocessing or the root LP with its infeasible flag set. A run that used up its time is a
  // time-limit stop, and "optimal" needs a solution.
  r.time_limit = model.isSecondsLimitReached() || r.seconds >= o.time_limit_s;
  r.infeasible = model.isProvenInfeasible() && !r.time_limit;
  const double* best = model.bestSolution();
  if (best != nullptr && model.getNumCols() == m.num_cols()) {
    r.has_solution = true;
    r.sol.assign(best, best + m.num_cols());
    r.objective = model.getObjValue() + m.obj_constant;
    r.bound = std::min(r.objective, model.getBestPossibleObjValue() + m.obj_constant);
    if (r.optimal) r.bound = r.objective;
  }
  return r;
}

Status no_fit_status(const PlanProblem& p) {
  return resource_exhausted(
      "plan: no plan fits gpu {:.2f} GB, host {:.2f} GB, nvme {:.2f} GB at batch {} x seq {}",
      p.gpu_cap_gb, p.host_cap_gb, p.nvme_cap_gb, p.batch_size, p.seq_len);
}

}  // namespace

Result<Plan> solve_milp(const PlanProblem& p, const SolveOptions& o) {
  FERRY_TRY(validate(p));
  const ScheduleModel sm(p);
  // The step is at least the constant (the GPU's fixed work) and at least the CPU optimizer's phase
  // (less the resident saving, which comes off after the max).
  const double floor =
      std::max(sm.model().obj_constant, optimizer_phase_ms(p) - resident_saved_total_ms(p));
  const CbcOutcome r = run_cbc(sm.model(), o, floor);
  // The best fixed policy within the model (span <= max_span), if it beats CBC's incumbent. Also
  // tried when CBC says infeasible: a fitting fixed policy is a proof that it is not, and a few LP
  // solves cost nothing next to a wrong "no plan fits".
  std::optional<Plan> seed;
  // Also when CBC stopped at the gap with one left open: a fixed policy within it may be better.
  const bool gap_left = r.has_solution && r.objective - r.bound > 1e-9 * std::max(1.0, r.objective);
  if (o.seed_with_fixed_policies && (!r.optimal || gap_left)) {
    for (const FixedPolicy& pol : fixed_policies(p.num_layers)) {
      if (pol.span > p.max_span) continue;
      Result<Plan> fp = solve_policy(p, pol);
      if (!fp.ok()) continue;
      const double obj = fp->solver.objective_ms;
      if ((!r.has_solution || obj < r.objective - 1e-9) &&
          (!seed || obj < seed->solver.objective_ms)) {
        seed = std::move(fp).value();
      }
    }
  }
  if (seed) {
    seed->policy = "solved";
    seed->solver.solver = "cbc+seed";
    seed->solver.status = r.time_limit ? "time_limit"
                          : r.optimal  ? "within_gap"
                                       : "cbc_no_incumbent";
    seed->solver.bound_ms = r.has_solution ? r.bound : 0;
    const double obj = seed->solver.objective_ms;
    seed->solver.gap = obj > 0 ? std::max(0.0, (obj - seed->solver.bound_ms) / obj) : 0;
    seed->solver.seconds = r.seconds;
    return std::move(*seed);
  }
  if (!r.has_solution) {
    if (r.infeasible || !r.time_limit) return no_fit_status(p);
    return deadline_exceeded("plan: cbc found no feasible plan in {:.1f} s (batch {})",
                             o.time_limit_s, p.batch_size);
  }
  Plan plan = sm.extract_plan(r.sol);
  plan.policy = "solved";
  plan.solver.solver = "cbc";
  plan.solver.status = r.optimal ? "optimal" : "time_limit";
  plan.solver.objective_ms = r.objective;
  plan.solver.bound_ms = r.bound;
  plan.solver.gap = r.objective > 0 ? std::max(0.0, (r.objective - r.bound) / r.objective) : 0;
  plan.solver.seconds = r.seconds;
  FERRY_ASSIGN_OR_RETURN(plan.predicted, evaluate(p, plan));
  return plan;
}

Result<Plan> solve_fixed(const PlanProblem& p, const std::vector<Home>& homes,
                         const std::vector<Span>& spans, const std::string& policy,
                         const std::vector<bool>& keep) {
  FERRY_TRY(validate(p));
  const auto t0 = std::chrono::steady_clock::now();
  ScheduleModel sm(p);
  for (int j = 0; j < static_cast<int>(keep.size()) && j < p.num_layers; ++j) {
    if (keep[j] && !keep_allowed(p, j)) {
      return invalid_argument("plan: policy {} keeps layer {}'s internals, not allowed here",
                              policy, j);
    }
  }
  if (!keep.empty() && static_cast<int>(keep.size()) != p.num_layers) {
    return invalid_argument("plan: policy {}: {} keep flags for {} layers", policy, keep.size(),
                            p.num_layers);
  }
  sm.fix_choice(homes, spans, keep);
  auto osi = detail::make_osi(sm.model());
  osi->initialSolve();
  if (!osi->isProvenOptimal()) {
    return resource_exhausted(
        "plan: policy {} does not fit gpu {:.2f} GB, host {:.2f} GB at "
        "batch {} x seq {}",
        policy, p.gpu_cap_gb, p.host_cap_gb, p.batch_size, p.seq_len);
  }
  const double* x = osi->getColSolution();
  Plan plan = sm.extract_plan(std::vector<double>(x, x + sm.model().num_cols()));
  plan.policy = policy;
  plan.solver.solver = "fixed";
  plan.solver.status = "optimal";
  plan.solver.objective_ms = osi->getObjValue() + sm.model().obj_constant;
  plan.solver.bound_ms = plan.solver.objective_ms;
  plan.solver.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  FERRY_ASSIGN_OR_RETURN(plan.predicted, evaluate(p, plan));
  return plan;
}

Result<CapacityBound> min_capacity(const PlanProblem& p, Tier tier, const SolveOptions& o) {
  FERRY_TRY(validate(p));
  const ScheduleModel sm(p, &tier);
  const CbcOutcome r = run_cbc(sm.model(), o, sm.model().obj_constant);
  if (!r.has_solution) {
    return resource_exhausted("plan: no {} capacity makes batch {} fit the other budgets",
                              to_string(tier), p.batch_size);
  }
  CapacityBound b;
  b.capacity_gb = r.sol[sm.capacity_col()];
  b.bound_gb = std::min(b.capacity_gb, r.bound);
  b.optimal = r.optimal;
  return b;
}

}  // namespace ferry::plan
