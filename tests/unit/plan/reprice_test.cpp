// SPDX-License-Identifier: Apache-2.0
// A solved plan priced again at other rates (plan/reprice.h, `ferry plan --evaluate`): at the
// problem's own rates it is the solver's prediction; at other disk rates the NVMe terms follow
// the bounce-buffer formulas (problem.h nvme_store_ms_per_gb / nvme_fetch_ms_per_gb) with the
// same homes and transfers; bad rates and NVMe rates without an NVMe tier are refused.
#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <string>

#include "plan/evaluate.h"
#include "plan/milp.h"
#include "plan/plan_json.h"
#include "plan/reprice.h"
#include "tests/unit/plan/plan_test_util.h"

namespace ferry::plan {
namespace {

// testing::two_boundaries_must_leave_the_gpu (boundaries 0 and 1 must leave the GPU; neither fits
// in host memory) with room in host memory for the NVMe bounce buffer (1 GB beside the 1 GB of
// state) and a disk slow against the layers (~1 s per GB against 10 / 20 ms of compute), so both
// go to NVMe and the disk terms show in the step.
PlanProblem nvme_bound() {
  PlanProblem p = testing::two_boundaries_must_leave_the_gpu();
  p.host_cap_gb = 2.5;
  p.link.nvme_read_gbps = 1.5;
  p.link.nvme_write_gbps = 1.0;
  return p;
}

Plan solved(const PlanProblem& p) {
  Result<Plan> r = solve_milp(p, SolveOptions{});
  EXPECT_TRUE(r.ok()) << r.status().message();
  return std::move(r).value();
}

int nvme_homes(const Plan& pl) {
  int n = 0;
  for (Home h : pl.homes) n += h == Home::kNvme ? 1 : 0;
  return n;
}

TEST(Reprice, AtTheProblemsOwnRatesItIsTheSolversPrediction) {
  const PlanProblem p = nvme_bound();
  const Plan pl = solved(p);
  ASSERT_EQ(nvme_homes(pl), 2);
  Result<Repricing> r = reprice(p, pl, RateOverrides{});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_NEAR(r->as_solved.step_ms, pl.predicted.step_ms, 1e-9 * pl.predicted.step_ms);
  EXPECT_EQ(r->at_rates.step_ms, r->as_solved.step_ms);
  EXPECT_EQ(r->rates.nvme_read_gbps, p.link.nvme_read_gbps);
  // Through the JSON document ferry plan writes: the same plan and problem, the same price.
  const Json doc = plan_to_json(pl, &p);
  Result<Plan> back = plan_from_json(doc);
  Result<std::optional<PlanProblem>> q = plan_problem_from_json(doc);
  ASSERT_TRUE(back.ok() && q.ok() && q->has_value());
  Result<Repricing> r2 = reprice(**q, *back, RateOverrides{});
  ASSERT_TRUE(r2.ok()) << r2.status().message();
  EXPECT_EQ(r2->as_solved.step_ms, r->as_solved.step_ms);
}

TEST(Reprice, TheDiskTermsFollowTheNewRatesWithTheSameDecisions) {
  const PlanProblem p = nvme_bound();
  const Plan pl = solved(p);
  ASSERT_EQ(nvme_homes(pl), 2);
  RateOverrides o;
  o.nvme_write_gbps = 2.0;  // twice as fast both ways
  o.nvme_read_gbps = 3.0;
  Result<Repricing> r = reprice(p, pl, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  PlanProblem q = p;
  q.link.nvme_write_gbps = 2.0;
  q.link.nvme_read_gbps = 3.0;
  // Two 1 GB boundaries stored and fetched through the one bounce buffer.
  EXPECT_NEAR(r->as_solved.nvme_store_ms, 2.0 * nvme_store_ms_per_gb(p), 1e-9);
  EXPECT_NEAR(r->at_rates.nvme_store_ms, 2.0 * nvme_store_ms_per_gb(q), 1e-9);
  EXPECT_NEAR(r->as_solved.nvme_fetch_ms, 2.0 * nvme_fetch_ms_per_gb(p), 1e-9);
  EXPECT_NEAR(r->at_rates.nvme_fetch_ms, 2.0 * nvme_fetch_ms_per_gb(q), 1e-9);
  EXPECT_LT(r->at_rates.step_ms, r->as_solved.step_ms);
  // The evaluator on the changed problem directly: the same prediction (nothing re-solved).
  Result<Prediction> direct = evaluate(q, pl);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(direct->step_ms, r->at_rates.step_ms);
  // Memory does not depend on rates.
  EXPECT_EQ(r->at_rates.gpu_peak_gb, r->as_solved.gpu_peak_gb);
  EXPECT_EQ(r->at_rates.host_peak_gb, r->as_solved.host_peak_gb);
  // A slower link (not the disk) moves the stores' D2H and the fetches' H2D the same way.
  RateOverrides link;
  link.h2d_gbps = link.d2h_gbps = 5;
  Result<Repricing> slow = reprice(p, pl, link);
  ASSERT_TRUE(slow.ok());
  EXPECT_GT(slow->at_rates.nvme_store_ms, r->as_solved.nvme_store_ms);
  EXPECT_GT(slow->at_rates.step_ms, r->as_solved.step_ms);
}

TEST(Reprice, RefusesBadRatesAndNvmeRatesWithoutAnNvmeTier) {
  const PlanProblem p = nvme_bound();
  const Plan pl = solved(p);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    RateOverrides o;
    o.nvme_read_gbps = bad;
    Result<Repricing> r = reprice(p, pl, o);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("NVMe read"), std::string::npos) << r.status().message();
  }
  PlanProblem roomy = nvme_bound();
  roomy.nvme_cap_gb = 0;
  roomy.gpu_cap_gb = 10;  // everything fits on the GPU: no tier needed
  const Plan on_gpu = solved(roomy);
  RateOverrides o;
  o.nvme_write_gbps = 3;
  Result<Repricing> r = reprice(roomy, on_gpu, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("without an NVMe tier"), std::string::npos);
  // Link rates are fine there.
  RateOverrides link;
  link.h2d_gbps = 10;
  EXPECT_TRUE(reprice(roomy, on_gpu, link).ok());
}

}  // namespace
}  // namespace ferry::plan
