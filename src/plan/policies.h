// SPDX-License-Identifier: Apache-2.0
// Fixed activation policies as plans, priced under the same cost model as the solved plan so the
// two can be compared: all boundaries on the GPU, all interior boundaries in host memory, and
// checkpoint every K (boundaries 0, K, 2K, ... on the GPU, the rest recomputed on re-streamed
// weights, as MegaTrain does). Each policy's transfer schedule is the best one for it (the LP of
// milp.h solve_fixed), so a policy loses only by its discrete choice.
#pragma once

#include <string>
#include <vector>

#include "core/result.h"
#include "plan/choice.h"
#include "plan/plan.h"
#include "plan/problem.h"

namespace ferry::plan {

struct FixedPolicy {
  std::string name;  // "all-gpu", "all-host", "checkpoint-every-4"
  Choice choice;
  int span = 1;  // longest span the choice uses (the problem's max_span is raised to it)
};

// The three policies of issue #7: checkpoint every `k`, all on GPU, all on host.
std::vector<FixedPolicy> fixed_policies(int num_layers, int k = 4);
Result<FixedPolicy> fixed_policy_by_name(const std::string& name, int num_layers);

// resource_exhausted when the policy does not fit the capacities.
Result<Plan> solve_policy(const PlanProblem& p, const FixedPolicy& policy);

}  // namespace ferry::plan
