// SPDX-License-Identifier: Apache-2.0
#include "plan/policies.h"

#include <algorithm>
#include <cstdlib>

#include "plan/milp.h"

namespace ferry::plan {

std::vector<FixedPolicy> fixed_policies(int num_layers, int k) {
  return {
      FixedPolicy{"checkpoint-every-" + std::to_string(k),
                  checkpoint_every(num_layers, k, Home::kGpu), std::min(k, num_layers)},
      FixedPolicy{"all-gpu", all_materialized(num_layers, Home::kGpu), 1},
      FixedPolicy{"all-host", all_materialized(num_layers, Home::kHost), 1},
  };
}

Result<FixedPolicy> fixed_policy_by_name(const std::string& name, int num_layers) {
  if (name == "all-gpu") return FixedPolicy{name, all_materialized(num_layers, Home::kGpu), 1};
  if (name == "all-host") return FixedPolicy{name, all_materialized(num_layers, Home::kHost), 1};
  const std::string prefix = "checkpoint-every-";
  if (name.rfind(prefix, 0) == 0) {
    const int k = std::atoi(name.c_str() + prefix.size());
    if (k >= 1) {
      return FixedPolicy{name, checkpoint_every(num_layers, k, Home::kGpu),
                         std::min(k, num_layers)};
    }
  }
  return invalid_argument("plan: unknown policy \"{}\" (all-gpu, all-host, checkpoint-every-K)",
                          name);
}

Result<Plan> solve_policy(const PlanProblem& p, const FixedPolicy& policy) {
  PlanProblem q = p;
  q.max_span = std::max(q.max_span, policy.span);
  return solve_fixed(q, policy.choice.homes, policy.choice.spans, policy.name);
}

}  // namespace ferry::plan
