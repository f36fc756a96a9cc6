// SPDX-License-Identifier: Apache-2.0
// The MILP against the exact enumerator on random small instances (L <= 6, fixed seed): same
// optimum (or both infeasible), and both plans pass the independent evaluator with the solver's
// objective and every capacity respected.
#include <gtest/gtest.h>

#include <cmath>

#include "plan/evaluate.h"
#include "plan/exact.h"
#include "plan/milp.h"
#include "tests/unit/plan/plan_test_util.h"

namespace ferry::plan {
namespace {

// Solver tolerances: CBC/Clp satisfy rows to ~1e-7 absolute; objectives are O(10..100) ms.
constexpr double kRelTol = 1e-6;

void expect_consistent(const PlanProblem& p, const Plan& plan, const std::string& what) {
  auto pred = evaluate(p, plan);
  ASSERT_TRUE(pred.ok()) << what << ": " << pred.status().to_string();
  EXPECT_TRUE(check_fits(p, *pred).ok()) << what << ": " << check_fits(p, *pred).to_string();
  EXPECT_NEAR(pred->objective_ms, plan.solver.objective_ms,
              kRelTol * std::max(1.0, plan.solver.objective_ms))
      << what << ": evaluator and solver disagree on the plan's cost";
}

TEST(MilpVsExact, SameOptimumOnRandomSmallInstances) {
  std::mt19937_64 rng(20261130);
  int both_feasible = 0, both_infeasible = 0, with_recompute = 0, with_offload = 0;
  for (int n = 0; n < 60; ++n) {
    const int L = 2 + n % 4 + (n % 10 == 9 ? 1 : 0);  // 2..6
    const bool nvme = n % 3 == 0 && L <= 4;
    const double gpu_fraction = testing::uniform(rng, 0.0, 0.8);
    const PlanProblem p = testing::random_problem(rng, L, nvme, gpu_fraction);
    SCOPED_TRACE(::testing::Message()
                 << "instance " << n << " L=" << L << " nvme=" << nvme << " R=" << p.max_span);
    auto exact = solve_exact(p);
    auto milp = solve_milp(p, SolveOptions{.time_limit_s = 30});
    if (!exact.ok()) {
      EXPECT_EQ(exact.status().code(), StatusCode::kResourceExhausted)
          << exact.status().to_string();
      EXPECT_FALSE(milp.ok()) << "milp found a plan the exact solver says cannot exist";
      if (!milp.ok()) {
        EXPECT_EQ(milp.status().code(), StatusCode::kResourceExhausted);
      }
      ++both_infeasible;
      continue;
    }
    ASSERT_TRUE(milp.ok()) << milp.status().to_string();
    EXPECT_EQ(milp->solver.solver, "cbc");  // CBC's own optimum, not a fixed-policy seed
    EXPECT_EQ(milp->solver.status, "optimal");
    const double want = exact->best.solver.objective_ms;
    EXPECT_NEAR(milp->solver.objective_ms, want, kRelTol * std::max(1.0, want));
    expect_consistent(p, *milp, "milp");
    expect_consistent(p, exact->best, "exact");
    ++both_feasible;
    if (milp->predicted.recompute_ms > 0) ++with_recompute;
    if (!milp->transfers.empty()) ++with_offload;
  }
  // The generator must exercise every regime, or the comparison proves little.
  EXPECT_GE(both_feasible, 30);
  EXPECT_GE(both_infeasible, 1);
  EXPECT_GE(with_recompute, 5);
  EXPECT_GE(with_offload, 5);
}

}  // namespace
}  // namespace ferry::plan
