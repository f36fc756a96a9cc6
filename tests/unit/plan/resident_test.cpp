// SPDX-License-Identifier: Apache-2.0
// GPU-resident layers in the planner (PlanProblem::resident_layers, plan/resident.h, docs/plan.md
// "resident layers"): the MILP inside the outer search over K equals the exact enumerator's
// optimum over every K on random small instances (device tail and kept internals included);
// every plan's GPU memory, the resident bytes included, fits the cap; with plenty of memory the
// plan makes layers resident and the optimizer wait drops; with memory tight K = 0; the plan and
// problem JSON carry K (old documents: 0).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "plan/evaluate.h"
#include "plan/exact.h"
#include "plan/milp.h"
#include "plan/plan_json.h"
#include "plan/resident.h"
#include "tests/unit/plan/plan_test_util.h"
#include "tests/unit/plan/planners.h"

namespace ferry::plan {
namespace {

using testing::milp_planner;

constexpr double kRelTol = 1e-6;

// Resident costs drawn from their own stream: per layer 0.05..hi_gb GB; an update time measured
// (0.2..2 ms) or derived (0: kResidentUpdateMsPerGb x the bytes).
void add_resident_costs(std::mt19937_64& rng, PlanProblem& p, double hi_gb) {
  for (LayerCost& c : p.layers) c.resident_gb = testing::uniform(rng, 0.05, hi_gb);
  p.resident_update_ms_per_layer = rng() % 2 == 0 ? 0.0 : testing::uniform(rng, 0.2, 2.0);
}

// The CPU optimizer a few forward passes long, so that the gate binds and residency pays.
void gate_the_forward(std::mt19937_64& rng, PlanProblem& p) {
  double fwd = 0;
  for (const LayerCost& c : p.layers) fwd += c.fwd_ms;
  p.cpu_optimizer_ms = fwd * testing::uniform(rng, 2.0, 6.0);
}

void expect_plan_ok(const PlanProblem& p, const Plan& plan, const std::string& what) {
  const PlanProblem at = at_resident(p, plan.resident_layers);
  auto pred = evaluate(at, plan);
  ASSERT_TRUE(pred.ok()) << what << ": " << pred.status().to_string();
  EXPECT_TRUE(check_fits(at, *pred).ok()) << what << ": " << check_fits(at, *pred).to_string();
  EXPECT_NEAR(pred->objective_ms, plan.predicted.objective_ms,
              kRelTol * std::max(1.0, pred->objective_ms))
      << what;
  // Every window holds the resident bytes.
  EXPECT_NEAR(pred->resident_gb, resident_gpu_gb(at), 1e-12);
  for (double gb : pred->window_gpu_gb) EXPECT_GE(gb, at.gpu_fixed_gb + pred->resident_gb - 1e-9);
  EXPECT_LE(pred->gpu_peak_gb, p.gpu_cap_gb + kGbTolerance) << what;
}

TEST(Resident, SearchWithMilpEqualsExactOverEveryK) {
  std::mt19937_64 rng(20261204);
  std::mt19937_64 rng_res(20261205);
  int feasible = 0, resident = 0, partial = 0, zero_by_memory = 0;
  for (int n = 0; n < 30; ++n) {
    const int L = 2 + n % 3;  // 2..4 (5 layers took most of its ~10 min under ASan + UBSan)
    PlanProblem p = testing::random_problem(rng, L, n % 5 == 0, testing::uniform(rng, 0.0, 0.8));
    if (n % 2 == 0) gate_the_forward(rng, p);
    if (n % 3 == 0) testing::add_keep_costs(rng, p, 0.1, 1.0);
    if (n % 7 == 3) p.device_update_layers = 1 + static_cast<int>(rng() % L);
    add_resident_costs(rng_res, p, 0.8);
    // The measured resident saving (resident_saving_test.cpp) on some: a constant at each K, so
    // the search's optimum over K moves with it, the MILP's and the exact solver's alike.
    if (n % 4 == 1) p.resident_saved_ms = testing::uniform(rng_res, 0.5, 5.0);
    SCOPED_TRACE(::testing::Message() << "instance " << n << " L=" << L << " opt "
                                      << p.cpu_optimizer_ms << " tail " << p.device_update_layers);
    // The exact optimum over every K.
    double want = std::numeric_limits<double>::infinity();
    int want_k = -1;
    for (int k = 0; k <= L; ++k) {
      auto e = solve_exact(at_resident(p, k));
      if (!e.ok()) {
        EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
        continue;
      }
      EXPECT_EQ(e->best.resident_layers, k);
      EXPECT_LE(e->max_lp_mismatch_ms, kRelTol * std::max(1.0, e->best.solver.objective_ms));
      // Feasibility is monotone in K (what the search's early stop relies on).
      if (k > 0) {
        EXPECT_TRUE(solve_exact(at_resident(p, k - 1)).ok()) << "K " << k << " fits, K-1 not";
      }
      if (e->best.solver.objective_ms < want - 1e-9) {
        want = e->best.solver.objective_ms;
        want_k = k;
      }
    }
    auto s = search_resident(p, milp_planner(), kResidentAuto);
    if (want_k < 0) {
      EXPECT_FALSE(s.ok()) << "the search found a plan no K admits";
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_NEAR(s->plan.predicted.objective_ms, want, kRelTol * std::max(1.0, want));
    expect_plan_ok(p, s->plan, "search");
    // The exact solver inside the same search gives the same optimum.
    auto se = search_resident(
        p,
        [](const PlanProblem& q) -> Result<Plan> {
          FERRY_ASSIGN_OR_RETURN(ExactResult e, solve_exact(q));
          e.best.predicted.objective_ms = e.best.solver.objective_ms;
          return std::move(e.best);
        },
        kResidentAuto);
    ASSERT_TRUE(se.ok());
    EXPECT_NEAR(se->plan.solver.objective_ms, want, kRelTol * std::max(1.0, want));
    ++feasible;
    if (s->plan.resident_layers > 0) ++resident;
    if (s->plan.resident_layers > 0 && s->plan.resident_layers < L) ++partial;
    if (s->plan.resident_layers == 0 && !solve_exact(at_resident(p, 1)).ok()) ++zero_by_memory;
  }
  EXPECT_GE(feasible, 18);
  EXPECT_GE(resident, 4);
  EXPECT_GE(partial, 2);
  EXPECT_GE(zero_by_memory, 2);
  std::printf("resident search: %d feasible, %d resident (%d partial), %d zero by memory\n",
              feasible, resident, partial, zero_by_memory);
}

// A resident layer streams no weights and drains no gradients; its CPU update is gone.
TEST(Resident, ResidentLayerMovesNothingAndSkipsTheCpu) {
  std::mt19937_64 rng(7);
  PlanProblem p = testing::random_problem(rng, 4, false, 1.0);
  p.gpu_cap_gb = 1e3;
  gate_the_forward(rng, p);
  for (LayerCost& c : p.layers) c.resident_gb = 0.5;
  const PlanProblem all = at_resident(p, 4);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(streamed_weight_gb(all, j), 0.0);
    EXPECT_EQ(drained_grad_gb(all, j), 0.0);
  }
  EXPECT_NEAR(optimizer_phase_ms(all), 0.0, 1e-9);
  EXPECT_NEAR(resident_gpu_gb(all), 2.0, 1e-12);
  EXPECT_NEAR(resident_update_layer_ms(all, 0), kResidentUpdateMsPerGb * 0.5, 1e-12);
  for (double u : optimizer_ready_ms(all)) EXPECT_EQ(u, 0.0);
  auto r = solve_milp(all, SolveOptions{.time_limit_s = 30});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->predicted.optimizer_wait_ms, 0.0, 1e-9);
  EXPECT_NEAR(r->predicted.resident_gb, 2.0, 1e-12);
}

// Plenty of memory: the plan makes layers resident and the predicted optimizer wait drops; the
// same problem with the cap just above the K = 0 optimum's need: K = 0.
TEST(Resident, PlentyOfMemoryMakesLayersResidentTightMemoryNone) {
  std::mt19937_64 rng(20261206);
  int checked = 0;
  for (int n = 0; n < 10; ++n) {
    PlanProblem p = testing::random_problem(rng, 4, false, 1.0);
    gate_the_forward(rng, p);
    for (LayerCost& c : p.layers) c.resident_gb = 0.3;
    p.gpu_cap_gb = 1e3;
    auto zero = solve_milp(p, SolveOptions{.time_limit_s = 30});
    ASSERT_TRUE(zero.ok());
    if (!(zero->predicted.optimizer_wait_ms > 1.0)) continue;
    auto s = search_resident(p, milp_planner(), kResidentAuto);
    ASSERT_TRUE(s.ok());
    EXPECT_GT(s->plan.resident_layers, 0);
    EXPECT_LT(s->plan.predicted.optimizer_wait_ms, zero->predicted.optimizer_wait_ms);
    EXPECT_LT(s->plan.predicted.step_ms, zero->predicted.step_ms);
    // Tight: the smallest GPU capacity any K = 0 plan needs, plus less than one resident layer.
    auto need = min_capacity(p, Tier::kGpu);
    ASSERT_TRUE(need.ok());
    PlanProblem tight = p;
    tight.gpu_cap_gb = need->capacity_gb + 0.1;
    auto t = search_resident(tight, milp_planner(), kResidentAuto);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(t->plan.resident_layers, 0);
    expect_plan_ok(tight, t->plan, "tight");
    // Forced K refuses what does not fit with the solver's own message.
    auto forced = search_resident(tight, milp_planner(), 4);
    EXPECT_FALSE(forced.ok());
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

TEST(Resident, PlanAndProblemJsonCarryK) {
  std::mt19937_64 rng(11);
  PlanProblem p = testing::random_problem(rng, 3, false, 1.0);
  p.gpu_cap_gb = 1e3;
  for (LayerCost& c : p.layers) c.resident_gb = 0.25;
  p = at_resident(p, 2);
  p.resident_update_ms_per_layer = 0.8;
  auto plan = solve_milp(p, SolveOptions{.time_limit_s = 30});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->resident_layers, 2);
  const Json j = plan_to_json(*plan, &p);
  EXPECT_EQ(j.at("resident_layers").get<int>(), 2);
  auto back = plan_from_json(j);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, *plan);
  auto prob = plan_problem_from_json(j);
  ASSERT_TRUE(prob.ok() && prob->has_value());
  EXPECT_EQ((*prob)->resident_layers, 2);
  EXPECT_EQ((*prob)->resident_update_ms_per_layer, 0.8);
  EXPECT_EQ((*prob)->layers[1].resident_gb, 0.25);
  // An older document without the keys: nothing resident.
  Json old = j;
  old.erase("resident_layers");
  old["problem"].erase("resident_layers");
  auto old_plan = plan_from_json(old);
  ASSERT_TRUE(old_plan.ok());
  EXPECT_EQ(old_plan->resident_layers, 0);
  auto old_prob = plan_problem_from_json(old);
  ASSERT_TRUE(old_prob.ok() && old_prob->has_value());
  EXPECT_EQ((*old_prob)->resident_layers, 0);
  // A problem without resident layers serializes as before (no keys).
  const Json none = to_json(at_resident(p, 0));
  EXPECT_FALSE(none.contains("resident_layers"));
}

// Deeper models: the coarse-to-fine search tries fewer K than L + 1 and returns a fitting plan no
// worse than K = 0 and the largest K it tried.
TEST(Resident, CoarseSearchOnDeepModels) {
  std::mt19937_64 rng(20261207);
  PlanProblem p = testing::random_problem(rng, 16, false, 0.5);
  p.max_span = 2;
  gate_the_forward(rng, p);
  for (LayerCost& c : p.layers) c.resident_gb = 0.2;
  p.gpu_cap_gb += 1.5;  // room for some resident layers
  auto s = search_resident(p, milp_planner(), kResidentAuto);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_LT(s->tried.size(), 17u);
  expect_plan_ok(p, s->plan, "deep");
  for (std::size_t i = 0; i < s->tried.size(); ++i) {
    EXPECT_LE(s->plan.predicted.objective_ms, s->objective_ms[i] + 1e-6) << "K " << s->tried[i];
  }
  EXPECT_GT(s->plan.resident_layers, 0);
}

}  // namespace
}  // namespace ferry::plan
