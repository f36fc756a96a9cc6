// SPDX-License-Identifier: Apache-2.0
// The outer search over batch size and the diagnosis of budgets no plan fits.
//
// largest_batch: memory grows with the batch, so "some plan fits" is monotone in B; the search
// doubles B until nothing fits, then bisects. Every probe is priced by the planner's objective,
// the predicted step time incl. the CPU optimizer (Prediction::step_ms). With
// require_low_exposure it then walks down from the largest fitting B to the largest whose plan
// idles the GPU at most max_exposed_fraction of the step (Prediction::idle_ms: exposed transfers,
// forward windows held by the CPU optimizer, the optimizer outlasting the GPU). The walk stops
// early where the optimizer's idle alone is over the limit (a smaller batch hides less of it). If
// no batch tried is within the limit, the one of the highest throughput (B / step_ms) among all
// solved is chosen, flagged.
//
// diagnose_infeasible: for each tier, the smallest capacity of that tier with the other tiers
// unchanged (an MILP, milp.h min_capacity); the binding constraint is the first tier whose
// minimum exceeds its capacity. The message names it, where it binds and the budget that fits.
#pragma once

#include <functional>
#include <string>

#include "core/result.h"
#include "plan/milp.h"
#include "plan/plan.h"
#include "plan/problem.h"
#include "plan/schedule_model.h"

namespace ferry::plan {

using ProblemAt = std::function<Result<PlanProblem>(int batch)>;
using Planner = std::function<Result<Plan>(const PlanProblem&)>;

struct BatchSearchOptions {
  int max_batch = 1024;
  bool require_low_exposure = true;
  double max_exposed_fraction = 0.02;  // GPU idle "near zero": <= 2 % of the step
  // When set, the doubling and bisection (where some plan fits: monotone in the batch) ask this
  // planner, and `planner` solves only the largest fitting batch and the exposure walk-down. For a
  // planner whose fitting does not depend on a choice it searches (ferry plan's search over
  // GPU-resident layers: resident bytes only add memory, so K = 0 fits wherever any K fits), a
  // cheaper twin that fits exactly where `planner` does.
  Planner fit_planner;
};

struct BatchSearchResult {
  int batch = 0;             // the chosen batch
  int largest_fitting = 0;   // the largest batch some plan fits
  bool exposure_ok = false;  // the chosen plan's idle_ms() is within max_exposed_fraction
  int probes = 0;            // plans solved
  Plan plan;
  PlanProblem problem;
};

// resource_exhausted when not even batch 1 fits.
Result<BatchSearchResult> largest_batch(const ProblemAt& problem_at, const Planner& planner,
                                        const BatchSearchOptions& o);

struct Infeasibility {
  Tier tier = Tier::kGpu;
  double capacity_gb = 0;      // what was given
  double min_capacity_gb = 0;  // the smallest that fits, rounded up to 0.01 GB
  bool proven = false;         // min_capacity_gb is proven minimal (to the rounding)
  std::string message;
};

// For a problem no plan fits: which tier binds and the smallest budget of it that fits.
Result<Infeasibility> diagnose_infeasible(const PlanProblem& p, const SolveOptions& o = {});

// Solves, and on "no plan fits" returns the diagnosis as a resource_exhausted Status.
Result<Plan> solve_or_diagnose(const PlanProblem& p, const SolveOptions& o = {});

}  // namespace ferry::plan
