// SPDX-License-Identifier: Apache-2.0
#include "plan/search.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "core/log.h"

namespace ferry::plan {
namespace {

struct Probe {
  std::optional<Plan> plan;  // empty: no plan fits
  PlanProblem problem;
};

// Runs the planner at `batch`; "does not fit" (or no plan found in the time limit) is an empty
// probe, any other failure is returned.
Result<Probe> probe(const ProblemAt& problem_at, const Planner& planner, int batch, int& probes) {
  FERRY_ASSIGN_OR_RETURN(PlanProblem p, problem_at(batch));
  ++probes;
  Result<Plan> r = planner(p);
  Probe out{std::nullopt, std::move(p)};
  if (r.ok()) {
    out.plan = std::move(r).value();
    return out;
  }
  const StatusCode code = r.status().code();
  if (code == StatusCode::kResourceExhausted || code == StatusCode::kDeadlineExceeded) return out;
  return std::move(r).take_status();
}

// The chosen plan's GPU idle (exposed transfers, forward held by the optimizer, the optimizer
// outlasting the GPU) within `fraction` of its step.
bool idle_ok(const Plan& plan, double fraction) {
  return plan.predicted.idle_ms() <= fraction * plan.predicted.step_ms;
}

// The CPU optimizer's share of that idle alone over the limit.
bool optimizer_over(const Plan& plan, double fraction) {
  const Prediction& r = plan.predicted;
  return r.optimizer_wait_ms + r.optimizer_bound_ms > fraction * r.step_ms;
}

// Samples per ms of step: the throughput the fallback maximizes (tokens/s up to the fixed seq).
double throughput(const Probe& pr) {
  return pr.plan->predicted.step_ms > 0 ? pr.problem.batch_size / pr.plan->predicted.step_ms : 0;
}

}  // namespace

Result<BatchSearchResult> largest_batch(const ProblemAt& problem_at, const Planner& planner,
                                        const BatchSearchOptions& o) {
  BatchSearchResult res;
  const Planner& fits = o.fit_planner ? o.fit_planner : planner;
  FERRY_ASSIGN_OR_RETURN(Probe lo, probe(problem_at, fits, 1, res.probes));
  if (!lo.plan) {
    return resource_exhausted("plan: not even batch 1 fits (gpu {:.2f} GB, host {:.2f} GB)",
                              lo.problem.gpu_cap_gb, lo.problem.host_cap_gb);
  }
  // The fitting probe of the highest throughput (the larger batch on a tie), kept for the case
  // where no batch meets the idle limit.
  std::optional<Probe> fastest;
  std::vector<int> solved_batches;  // the batches `planner` solved (consider()ed)
  const auto consider = [&](const Probe& pr) {
    solved_batches.push_back(pr.problem.batch_size);
    if (pr.plan && (!fastest || throughput(pr) > throughput(*fastest) * (1 + 1e-12) ||
                    (throughput(pr) >= throughput(*fastest) * (1 - 1e-12) &&
                     pr.problem.batch_size > fastest->problem.batch_size))) {
      fastest = pr;
    }
  };
  // Only `planner`'s plans: with a fit planner, its plans are not the ones the search returns;
  // the batches it found fitting are solved by `planner` for the fallback below when needed.
  const bool fit_plans_count = !o.fit_planner;
  std::vector<int> fit_batches;
  const auto fitted = [&](const Probe& pr) {
    if (fit_plans_count) {
      consider(pr);
    } else if (pr.plan) {
      fit_batches.push_back(pr.problem.batch_size);
    }
  };
  fitted(lo);
  // Doubling, then bisection between the last fitting and the first failing batch.
  int good = 1, bad = -1;
  Probe best = std::move(lo);
  while (bad < 0 && good < o.max_batch) {
    const int b = std::min(o.max_batch, good * 2);
    FERRY_ASSIGN_OR_RETURN(Probe pr, probe(problem_at, fits, b, res.probes));
    fitted(pr);
    if (pr.plan) {
      good = b;
      best = std::move(pr);
    } else {
      bad = b;
    }
  }
  while (bad > 0 && bad - good > 1) {
    const int mid = good + (bad - good) / 2;
    FERRY_ASSIGN_OR_RETURN(Probe pr, probe(problem_at, fits, mid, res.probes));
    fitted(pr);
    if (pr.plan) {
      good = mid;
      best = std::move(pr);
    } else {
      bad = mid;
    }
  }
  if (!fit_plans_count) {
    // The largest fitting batch, solved by the planner itself; it fits there too (the fit
    // planner's contract), so "does not fit" here is a broken twin, returned as an error.
    FERRY_ASSIGN_OR_RETURN(Probe pr, probe(problem_at, planner, good, res.probes));
    if (!pr.plan) {
      return internal_error("plan: batch {} fits by the fit planner but not by the planner", good);
    }
    consider(pr);
    best = std::move(pr);
  }
  res.largest_fitting = good;
  res.batch = good;
  res.exposure_ok = idle_ok(*best.plan, o.max_exposed_fraction);
  if (o.require_low_exposure && !res.exposure_ok) {
    // Walk down in 16 steps at most; fitting is monotone, so every smaller batch fits. Stop where
    // the CPU optimizer alone idles the GPU past the limit: its work per step does not depend on
    // the batch while the forward compute that hides it shrinks with it, so a smaller batch only
    // waits longer (docs/plan.md, "batch size").
    const int step = std::max(1, good / 16);
    bool stop = optimizer_over(*best.plan, o.max_exposed_fraction);
    for (int b = good - step; b >= 1 && !stop; b -= step) {
      FERRY_ASSIGN_OR_RETURN(Probe pr, probe(problem_at, planner, b, res.probes));
      if (!pr.plan) continue;
      consider(pr);
      if (idle_ok(*pr.plan, o.max_exposed_fraction)) {
        res.batch = b;
        res.exposure_ok = true;
        best = std::move(pr);
        break;
      }
      stop = optimizer_over(*pr.plan, o.max_exposed_fraction);
    }
    if (!res.exposure_ok && !fit_plans_count) {
      // The fallback chooses among the batches the search solved; with a fit planner those of the
      // doubling and bisection were not solved by `planner` yet: solve them now, so that the
      // choice is the one the search without a fit planner makes.
      for (int b : fit_batches) {
        if (std::find(solved_batches.begin(), solved_batches.end(), b) != solved_batches.end()) {
          continue;  // the largest fitting batch or one the walk-down solved
        }
        FERRY_ASSIGN_OR_RETURN(Probe pr, probe(problem_at, planner, b, res.probes));
        consider(pr);
      }
    }
    if (!res.exposure_ok) {
      // None within the limit: the batch of the highest throughput among those solved.
      best = std::move(*fastest);
      res.batch = best.problem.batch_size;
      log::get("plan")->warn(
          "the gpu idles more than {:.0f}% of the step (exposed transfers + optimizer wait and "
          "bound) at every batch tried; batch={} has the highest predicted throughput (largest "
          "fitting {})",
          100 * o.max_exposed_fraction, res.batch, good);
    }
  }
  res.plan = std::move(*best.plan);
  res.problem = std::move(best.problem);
  return res;
}

namespace {

double capacity_of(const PlanProblem& p, Tier t) {
  switch (t) {
    case Tier::kGpu:
      return p.gpu_cap_gb;
    case Tier::kHost:
      return p.host_cap_gb;
    case Tier::kNvme:
      return p.nvme_cap_gb;
  }
  return 0;
}

}  // namespace

Result<Infeasibility> diagnose_infeasible(const PlanProblem& p, const SolveOptions& o) {
  std::vector<Tier> tiers = {Tier::kGpu, Tier::kHost};
  if (p.has_nvme()) tiers.push_back(Tier::kNvme);
  std::string alternatives;
  std::optional<Infeasibility> found;
  for (Tier t : tiers) {
    Result<CapacityBound> b = min_capacity(p, t, o);
    if (!b.ok()) continue;  // relaxing this tier alone does not help
    if (b->capacity_gb <= capacity_of(p, t) + 1e-9) continue;  // not binding
    Infeasibility inf;
    inf.tier = t;
    inf.capacity_gb = capacity_of(p, t);
    inf.min_capacity_gb = std::ceil(b->capacity_gb * 100 - 1e-6) / 100;
    inf.proven = b->optimal;
    if (!found) {
      found = inf;
    } else {
      alternatives += fmt::format("; or {} >= {:.2f} GB", to_string(t), inf.min_capacity_gb);
    }
  }
  if (!found) {
    return resource_exhausted(
        "plan: no plan fits at batch {} x seq {} and no single budget (gpu {:.2f} GB, host "
        "{:.2f} GB, nvme {:.2f} GB) can be raised alone to fix it",
        p.batch_size, p.seq_len, p.gpu_cap_gb, p.host_cap_gb, p.nvme_cap_gb);
  }
  Infeasibility& inf = *found;
  std::string where;
  if (inf.tier == Tier::kHost && p.host_fixed_gb > p.host_cap_gb) {
    where = fmt::format(" (model state alone needs {:.2f} GB)", p.host_fixed_gb);
  }
  if (inf.tier == Tier::kGpu) {  // where the GPU peaks in the plan at the smallest budget
    PlanProblem at_min = p;
    at_min.gpu_cap_gb = inf.min_capacity_gb;
    if (Result<Plan> r = solve_milp(at_min, o); r.ok()) {
      where = fmt::format(" (peak in {})", window_description(p, r->predicted.gpu_peak_window));
    }
  }
  inf.message = fmt::format(
      "plan: no plan fits at batch {} x seq {}: binding constraint {} (capacity {:.2f} GB){}; "
      "the smallest {} budget that fits is {}{:.2f} GB with the other budgets unchanged{}",
      p.batch_size, p.seq_len, to_string(inf.tier), inf.capacity_gb, where, to_string(inf.tier),
      inf.proven ? "" : "at most ", inf.min_capacity_gb, alternatives);
  return inf;
}

Result<Plan> solve_or_diagnose(const PlanProblem& p, const SolveOptions& o) {
  Result<Plan> r = solve_milp(p, o);
  if (r.ok() || r.status().code() != StatusCode::kResourceExhausted) return r;
  FERRY_ASSIGN_OR_RETURN(Infeasibility inf, diagnose_infeasible(p, o));
  return resource_exhausted("{}", inf.message);
}

}  // namespace ferry::plan
