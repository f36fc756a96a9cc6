// SPDX-License-Identifier: Apache-2.0
// Choice: the discrete half of a plan — which boundaries are materialized and where, and the
// recompute spans — without the transfer schedule (which an LP fills in, milp.h solve_fixed) and
// without kept internals (none in a Choice; the exact enumerator searches their subsets per
// Choice, exact.cpp). The fixed policies (checkpoint every K, all on GPU, all on host) and the
// exact enumerator are sets of Choices.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "plan/problem.h"

namespace ferry::plan {

struct Choice {
  std::vector<Home> homes;  // [L+1]
  std::vector<Span> spans;
};

// Every boundary materialized in `home` (0 and L always on the GPU), nothing recomputed.
Choice all_materialized(int num_layers, Home home);
// Boundaries 0, K, 2K, ..., L materialized in `home` (0 and L on the GPU); the layers between
// recomputed in backward on re-streamed weights (MegaTrain's behaviour). K >= 1.
Choice checkpoint_every(int num_layers, int k, Home home);

// Calls `visit` on every Choice the model admits for `p`: every path with spans <= max_span, both
// weight variants of each recomputing span, every home of each materialized interior boundary
// (GPU, host, and NVMe when the problem has an NVMe tier). Exponential: small L only.
// Returns the number visited.
long long for_each_choice(const PlanProblem& p, const std::function<void(const Choice&)>& visit);

}  // namespace ferry::plan
