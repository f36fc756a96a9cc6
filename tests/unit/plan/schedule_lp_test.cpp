// SPDX-License-Identifier: Apache-2.0
// The transfer LP against hand-made schedules: for every discrete choice of small random
// instances, the evaluator prices a simple schedule (offload as soon as produced, bring back in
// the last allowed window); when that schedule fits, the LP for the same choice must be feasible
// and no more expensive. This is what catches an LP that forbids or overcharges real schedules
// (the exact-vs-MILP test cannot, since both share the LP).
#include <gtest/gtest.h>

#include "plan/choice.h"
#include "plan/evaluate.h"
#include "plan/milp.h"
#include "tests/unit/plan/plan_test_util.h"

namespace ferry::plan {
namespace {

Plan simple_schedule(const PlanProblem& p, const Choice& c, bool split) {
  Plan plan;
  plan.num_layers = p.num_layers;
  plan.homes = c.homes;
  plan.spans = c.spans;
  std::vector<int> next(p.num_layers + 1, -1);
  for (const Span& s : c.spans) next[s.start] = s.end;
  for (int i = 0; i < p.num_layers; ++i) {
    if (c.homes[i] != Home::kHost && c.homes[i] != Home::kNvme) continue;
    const bool nvme = c.homes[i] == Home::kNvme;
    const double a = p.boundary_gb[i];
    const int d_lo = first_d2h_window(p, i);
    const int d_hi = nvme ? last_nvme_d2h_window(p, i) : last_d2h_window(p, i);
    const int h_lo = first_h2d_window(p, i), h_hi = last_h2d_window(p, next[i]);
    if (split) {  // half in the first allowed window, half in the last
      plan.transfers.push_back({i, d_lo, false, nvme, a / 2});
      plan.transfers.push_back({i, d_hi, false, nvme, a / 2});
      plan.transfers.push_back({i, h_lo, true, nvme, a / 2});
      plan.transfers.push_back({i, h_hi, true, nvme, a / 2});
    } else {
      plan.transfers.push_back({i, d_lo, false, nvme, a});
      plan.transfers.push_back({i, h_hi, true, nvme, a});
    }
  }
  return plan;
}

TEST(ScheduleLp, NeverWorseThanASimpleFittingSchedule) {
  std::mt19937_64 rng(7);
  int compared = 0;
  for (int n = 0; n < 12; ++n) {
    const int L = 2 + n % 3;
    const PlanProblem p = testing::random_problem(rng, L, n % 2 == 0, 0.4);
    for_each_choice(p, [&](const Choice& c) {
      for (bool split : {false, true}) {
        const Plan simple = simple_schedule(p, c, split);
        auto pred = evaluate(p, simple);
        ASSERT_TRUE(pred.ok()) << pred.status().to_string();
        if (!check_fits(p, *pred).ok()) continue;
        auto lp = solve_fixed(p, c.homes, c.spans, "choice");
        ASSERT_TRUE(lp.ok()) << "LP refuses a choice whose simple schedule fits: "
                             << lp.status().to_string();
        EXPECT_LE(lp->predicted.objective_ms, pred->objective_ms + 1e-6);
        ++compared;
      }
    });
  }
  EXPECT_GE(compared, 100);
}

// The same with kept internals: every discrete choice times every subset of kept layers. The
// simple schedule keeps the same layers; the LP for that choice must accept it when it fits and be
// no more expensive, and its own objective must be the evaluator's price of its plan (the MILP's
// keep terms in the memory, exposure and optimizer rows against evaluate.cpp's walk).
TEST(ScheduleLp, NeverWorseThanASimpleFittingScheduleWithKeptInternals) {
  std::mt19937_64 rng(8);
  int compared = 0, with_keeps = 0;
  for (int n = 0; n < 9; ++n) {
    const int L = 2 + n % 3;
    PlanProblem p = testing::random_problem(rng, L, n % 2 == 0, 0.4);
    p.cpu_optimizer_ms = n % 3 == 0 ? 0 : p.cpu_optimizer_ms * 3;
    testing::add_keep_costs(rng, p, 0.1, 1.0);
    for_each_choice(p, [&](const Choice& c) {
      for (int mask = 0; mask < (1 << L); ++mask) {
        std::vector<bool> keep(L);
        for (int j = 0; j < L; ++j) keep[j] = (mask >> j & 1) != 0;
        Plan simple = simple_schedule(p, c, mask % 2 == 1);
        simple.keep_internals = keep;
        auto pred = evaluate(p, simple);
        ASSERT_TRUE(pred.ok()) << pred.status().to_string();
        if (!check_fits(p, *pred).ok()) continue;
        auto lp = solve_fixed(p, c.homes, c.spans, "choice", keep);
        ASSERT_TRUE(lp.ok()) << "LP refuses a choice whose simple schedule fits: "
                             << lp.status().to_string();
        EXPECT_EQ(lp->num_kept(), simple.num_kept());
        EXPECT_LE(lp->predicted.objective_ms, pred->objective_ms + 1e-6);
        EXPECT_NEAR(lp->solver.objective_ms, lp->predicted.objective_ms,
                    1e-6 * std::max(1.0, lp->predicted.objective_ms));
        ++compared;
        if (mask != 0) ++with_keeps;
      }
    });
  }
  EXPECT_GE(compared, 100);
  EXPECT_GE(with_keeps, 50);
}

// Hand-checked accounting on a 2-layer problem: all boundaries on the host, one transfer each way.
TEST(Evaluate, HandComputedTwoLayerHostPlan) {
  PlanProblem p;
  p.num_layers = 2;
  p.boundary_gb = {1.0, 2.0, 3.0};
  p.layers = {LayerCost{10, 20, 10, 0.5, 0.25, 0.1, 0.2},
              LayerCost{10, 20, 10, 0.5, 0.25, 0.1, 0.2}};
  p.loss_ms = 5;
  p.loss_work_gb = 0.3;
  p.head_weight_gb = 0.4;
  p.head_grad_gb = 0.4;
  p.link = LinkRates{100, 100, 100, 100, 0, 0};
  p.gpu_cap_gb = 100;
  p.host_cap_gb = 100;
  p.gpu_fixed_gb = 1;
  p.host_fixed_gb = 10;
  p.max_span = 2;
  p.move_penalty_ms_per_gb = 0;
  p.model_flops_per_step = 1e12;
  Plan plan;
  plan.num_layers = 2;
  plan.homes = {Home::kGpu, Home::kHost, Home::kGpu};
  plan.spans = {{0, 1, false}, {1, 2, false}};
  // Boundary 1: out in f1 (window 1), back in the loss window (2); needed by b1 (window 3).
  plan.transfers = {{1, 1, false, false, 2.0}, {1, 2, true, false, 2.0}};
  auto r = evaluate(p, plan);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // Windows: f0 f1 loss b1 b0. f1 moves 2.0 GB D2H + 0.4 GB head H2D: duplex (2.4 GB) = 24 ms vs
  // 10 ms compute -> 14 ms exposed. loss: H2D 0.5 (W1) + 2.0 = 25 ms vs 5 -> 20 ms exposed.
  EXPECT_NEAR(r->window_exposed_ms[1], 14.0, 1e-9);
  EXPECT_NEAR(r->window_exposed_ms[2], 20.0, 1e-9);
  EXPECT_NEAR(r->exposed_ms, 34.0, 1e-9);
  EXPECT_NEAR(r->compute_ms, 10 + 10 + 5 + 20 + 20, 1e-9);
  // GPU at b1 (window 3): fixed 1 + work 0.2 + A0 1 + A1 back 2 = 4.2; at loss: 1 + 0.3 + A0 + A1
  // (arrived in that window) 2 + A2 3 = 7.3 (the peak).
  EXPECT_NEAR(r->window_gpu_gb[3], 4.2, 1e-9);
  EXPECT_NEAR(r->gpu_peak_gb, 7.3, 1e-9);
  EXPECT_EQ(r->gpu_peak_window, 2);
  EXPECT_NEAR(r->host_peak_gb, 12.0, 1e-9);
  // A transfer outside its window is refused.
  plan.transfers[1].window = 4;
  EXPECT_FALSE(evaluate(p, plan).ok());
}

}  // namespace
}  // namespace ferry::plan
