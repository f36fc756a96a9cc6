// SPDX-License-Identifier: Apache-2.0
// The solved plan next to the fixed policies under one cost model: at a common batch (step time,
// TFLOPS, fits or not) and at each one's own largest fitting batch. What `ferry plan` prints under
// its plan and what `ferry plan --compare` / bench/plan report. All figures are predictions of
// the cost model (analytic or profiled), not measurements.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "plan/milp.h"
#include "plan/plan.h"
#include "plan/search.h"

namespace ferry::plan {

struct PolicyRow {
  std::string policy;              // "solved", "checkpoint-every-4", "all-gpu", "all-host"
  std::optional<Plan> at_batch;    // empty: does not fit at the common batch
  int largest_batch = 0;           // 0: not even batch 1 fits
  std::optional<Plan> at_largest;  // the plan at largest_batch
  // Fixed policies only: the solved plan at this policy's largest batch (same batch, same budget:
  // the like-for-like comparison; never slower, since the policy is one of its candidates).
  std::optional<Plan> solved_at_largest;
};

struct Comparison {
  int batch = 0;  // the common batch
  std::vector<PolicyRow> rows;
};

struct CompareOptions {
  SolveOptions solve;        // for the solved plan at the common batch
  SolveOptions probe_solve;  // for the batch-search probes of the solved plan
  int max_batch = 512;
  int checkpoint_k = 4;
  // The solved plan at the common batch when the caller already has it (not re-solved).
  const Plan* solved_at_batch = nullptr;
  // The solved plan's solvers, when set, instead of solve_milp with `solve` / `probe_solve`
  // (`ferry plan` passes ones that also check the executor's byte count).
  Planner planner, probe_planner;
};

Result<Comparison> compare_policies(const ProblemAt& problem_at, int batch,
                                    const CompareOptions& o);

Json to_json(const Comparison& c);

}  // namespace ferry::plan
