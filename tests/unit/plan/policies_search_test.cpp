// SPDX-License-Identifier: Apache-2.0
// Fixed policies, infeasibility diagnosis and the batch-size search.
#include <gtest/gtest.h>

#include "plan/cost_model.h"
#include "plan/evaluate.h"
#include "plan/geometry.h"
#include "plan/milp.h"
#include "plan/policies.h"
#include "plan/search.h"
#include "tests/unit/plan/plan_test_util.h"

namespace ferry::plan {
namespace {

TEST(Policies, ShapesAndCostsUnderTheEvaluator) {
  std::mt19937_64 rng(11);
  PlanProblem p = testing::random_problem(rng, 8, false, 1.0);
  p.gpu_cap_gb = 1000;  // everything fits
  p.host_cap_gb = 1000;
  double homed = 0;  // all-host: boundaries 0..L-1 (the embedding's output too) out and back
  for (int i = 0; i < 8; ++i) homed += p.boundary_gb[i];
  for (const FixedPolicy& pol : fixed_policies(8, 4)) {
    auto plan = solve_policy(p, pol);
    ASSERT_TRUE(plan.ok()) << pol.name << ": " << plan.status().to_string();
    EXPECT_EQ(plan->spans, pol.choice.spans);
    EXPECT_EQ(plan->homes, pol.choice.homes);
    if (pol.name == "all-gpu") {
      EXPECT_TRUE(plan->transfers.empty());
      EXPECT_EQ(plan->predicted.recompute_ms, 0);
    } else if (pol.name == "all-host") {
      EXPECT_NEAR(plan->predicted.moved_gb, 2 * homed, 1e-6);
      EXPECT_EQ(plan->predicted.recompute_ms, 0);
    } else {
      ASSERT_EQ(pol.name, "checkpoint-every-4");
      double rec = 0;  // layers 0..2 and 4..6 re-run
      for (int k : {0, 1, 2, 4, 5, 6}) rec += p.layers[k].rec_ms;
      EXPECT_NEAR(plan->predicted.recompute_ms, rec, 1e-9);
      EXPECT_EQ(plan->homes[4], Home::kGpu);
      EXPECT_EQ(plan->homes[3], Home::kRecompute);
    }
    // The solved plan is never worse than a fixed policy the model admits (span <= max_span).
    PlanProblem q = p;
    q.max_span = 4;
    auto solved = solve_milp(q);
    ASSERT_TRUE(solved.ok());
    EXPECT_LE(solved->predicted.objective_ms, plan->predicted.objective_ms + 1e-6) << pol.name;
  }
}

TEST(Diagnose, GpuBudgetTooSmallNamesGpuAndTheSmallestBudgetThatFits) {
  std::mt19937_64 rng(5);
  int checked = 0;
  for (int n = 0; n < 8; ++n) {
    PlanProblem p = testing::random_problem(rng, 3 + n % 3, false, 0.3);
    p.host_cap_gb = p.host_fixed_gb + 0.3;  // little room to offload
    p.gpu_cap_gb = p.gpu_fixed_gb + 0.3;    // below the loss window: work >= 0.2 + A0 + AL >= 0.4
    auto r = solve_or_diagnose(p);
    ASSERT_FALSE(r.ok());
    ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(r.status().message().find("binding constraint gpu memory"), std::string::npos)
        << r.status().message();
    auto inf = diagnose_infeasible(p);
    ASSERT_TRUE(inf.ok()) << inf.status().to_string();
    EXPECT_EQ(inf->tier, Tier::kGpu);
    ASSERT_TRUE(inf->proven);
    EXPECT_NE(r.status().message().find(fmt::format("{:.2f} GB", inf->min_capacity_gb)),
              std::string::npos);
    PlanProblem fits = p;
    fits.gpu_cap_gb = inf->min_capacity_gb;
    EXPECT_TRUE(solve_milp(fits).ok()) << "the reported budget must fit";
    PlanProblem short_by = p;
    short_by.gpu_cap_gb = inf->min_capacity_gb - 0.01;
    auto no = solve_milp(short_by);
    EXPECT_FALSE(no.ok()) << "0.01 GB below the reported budget must not fit";
    if (!no.ok()) {
      EXPECT_EQ(no.status().code(), StatusCode::kResourceExhausted);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 8);
}

TEST(Diagnose, HostModelStateTooLargeNamesHost) {
  std::mt19937_64 rng(6);
  PlanProblem p = testing::random_problem(rng, 4, false, 1.0);
  p.gpu_cap_gb = 1000;
  p.host_cap_gb = p.host_fixed_gb - 0.25;
  auto r = solve_or_diagnose(p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("binding constraint host memory"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("model state alone"), std::string::npos);
  auto inf = diagnose_infeasible(p);
  ASSERT_TRUE(inf.ok());
  EXPECT_NEAR(inf->min_capacity_gb, std::ceil(p.host_fixed_gb * 100 - 1e-6) / 100, 1e-9);
}

// largest_batch against a linear scan: memory grows with the batch on a 4-layer problem.
TEST(BatchSearch, FindsTheLargestFittingBatch) {
  std::mt19937_64 rng(9);
  const PlanProblem base = testing::random_problem(rng, 4, false, 0.5);
  const ProblemAt at = [&](int b) -> Result<PlanProblem> {
    PlanProblem p = base;
    p.batch_size = b;
    for (double& a : p.boundary_gb) a *= b;
    for (LayerCost& c : p.layers) {
      c.fwd_ms *= b, c.bwd_ms *= b, c.rec_ms *= b, c.work_fwd_gb *= b, c.work_bwd_gb *= b;
    }
    p.loss_ms *= b;
    p.loss_work_gb *= b;
    p.gpu_cap_gb = base.gpu_fixed_gb + 12.0;
    p.host_cap_gb = base.host_fixed_gb + 3.0;
    return p;
  };
  const Planner solve = [](const PlanProblem& p) { return solve_milp(p); };
  int want = 0;
  for (int b = 1; b <= 40; ++b) {
    if (solve_milp(*at(b)).ok()) want = b;
  }
  ASSERT_GT(want, 1);
  ASSERT_LT(want, 40);
  auto r =
      largest_batch(at, solve, BatchSearchOptions{.max_batch = 40, .require_low_exposure = false});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->largest_fitting, want);
  EXPECT_EQ(r->batch, want);
  EXPECT_EQ(r->plan.batch_size, want);
}

TEST(BatchSearch, AutoOnARealGeometryKeepsExposureLow) {
  auto cfg = builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(cfg.ok());
  // A CPU optimizer fast enough to vanish (1e4 Gparam/s: 0.05 ms for 494M parameters), so the
  // idle left is the transfers' exposure (the optimizer's own case is below).
  MachineSpec fast_optimizer;
  fast_optimizer.cpu_optimizer_gparams_per_s = 1e4;
  const ProblemAt at = [&](int b) {
    return analytic_problem(*cfg, fast_optimizer, TrainShape{.batch_size = b, .seq_len = 512},
                            Capacities{.gpu_gb = 24, .host_gb = 64});
  };
  const Planner solve = [](const PlanProblem& p) {
    return solve_milp(p, SolveOptions{.time_limit_s = 10});
  };
  auto r = largest_batch(at, solve, BatchSearchOptions{.max_batch = 256});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GE(r->batch, 1);
  EXPECT_LE(r->batch, r->largest_fitting);
  EXPECT_TRUE(r->exposure_ok);
  EXPECT_LE(r->plan.predicted.idle_ms(), 0.02 * r->plan.predicted.step_ms);
  EXPECT_TRUE(check_fits(r->problem, r->plan.predicted).ok());
  // One more sample than the largest fitting batch does not fit.
  if (r->largest_fitting < 256) {
    EXPECT_FALSE(solve(*at(r->largest_fitting + 1)).ok());
  }
}

// The same geometry with the assumed 2 Gparam/s optimizer: 494M parameters take ~247 ms per step
// whatever the batch, and the forward windows wait for it (each layer's update, ~10 ms, is longer
// than its forward up to large batches). Every candidate step is then max(affine pieces of b with
// non-negative intercepts), so its time per sample falls as b grows: the GPU idles past 2 % at
// every batch, and the fastest batch is the largest that fits.
TEST(BatchSearch, AutoWithADominantOptimizerTakesTheFastestBatch) {
  auto cfg = builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(cfg.ok());
  const ProblemAt at = [&](int b) {
    return analytic_problem(*cfg, MachineSpec{}, TrainShape{.batch_size = b, .seq_len = 512},
                            Capacities{.gpu_gb = 24, .host_gb = 64});
  };
  const Planner solve = [](const PlanProblem& p) {
    return solve_milp(p, SolveOptions{.time_limit_s = 10});
  };
  auto r = largest_batch(at, solve, BatchSearchOptions{.max_batch = 64});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->exposure_ok);
  EXPECT_GT(r->plan.predicted.optimizer_wait_ms + r->plan.predicted.optimizer_bound_ms,
            0.02 * r->plan.predicted.step_ms);
  EXPECT_EQ(r->batch, r->largest_fitting);
  // The search stopped at once instead of walking down: doubling to 64 is 7 probes.
  EXPECT_EQ(r->probes, 7);
}

}  // namespace
}  // namespace ferry::plan
