// SPDX-License-Identifier: Apache-2.0
// The resident-saving term (PlanProblem::resident_saved_ms, docs/plan.md "the resident-saving
// term"): what a GPU-resident layer measured faster beyond the model. From a bench report's device
// run at K = 0 and a second report's device run with resident layers (bench_profile.h), through
// the profile's and the problem's JSON, into the evaluator and the search over K. MILP == exact
// with the term on random instances: resident_test.cpp. Also the batch search's fit planner
// (search.h), which ferry plan uses to search K only at the largest fitting batch.
#include <gtest/gtest.h>

#include <random>

#include "bench_report_util.h"
#include "plan/bench_profile.h"
#include "plan/cost_model.h"
#include "plan/evaluate.h"
#include "plan/geometry.h"
#include "plan/milp.h"
#include "plan/policies.h"
#include "plan/profile.h"
#include "plan/resident.h"
#include "plan/search.h"
#include "plan_test_util.h"

namespace ferry::plan {
namespace {

model::ModelConfig four_layers() { return testing::four_layer_model(); }

Json device_run(double step_ms, int resident_layers, int batch = 2) {
  return testing::bench_run("device", step_ms,
                            {{"batch_size", batch},
                             {"resident_layers", resident_layers},
                             {"exposed_ms_per_step", 8.0},
                             {"act_bytes_per_step", 0.0}});
}

Json report(const Json& run, int seq = 256) { return testing::bench_report({run}, seq); }

TEST(ResidentSaving, FromBenchDerivesTheTermPerResidentLayer) {
  const model::ModelConfig cfg = four_layers();
  const Json base = report(device_run(180, 0));
  auto without = predict_bench(base, cfg, MachineSpec{});
  ASSERT_TRUE(without.ok()) << without.status().to_string();
  EXPECT_EQ(without->profile.resident_saved_ms, 0);
  EXPECT_NE(resident_saved_text(without->profile).find("not measured"), std::string::npos);

  // 3 resident layers measured 80 ms faster than K = 0, and (another run) 95 ms faster.
  const Json resident = report(device_run(100, 3));
  auto b = predict_bench(base, cfg, MachineSpec{}, &resident);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_GT(b->profile.resident_saved_ms, 0);
  EXPECT_NE(b->profile.resident_saved_measured_by.find("K = 3 resident layers"), std::string::npos)
      << b->profile.resident_saved_measured_by;
  // Per resident layer, beyond the model: 15 ms more measured saving is 5 ms more per layer (the
  // model's own K = 0 - K = 3 difference is the same for both runs, so it drops out).
  const Json faster = report(device_run(85, 3));
  auto f = predict_bench(base, cfg, MachineSpec{}, &faster);
  ASSERT_TRUE(f.ok());
  EXPECT_NEAR(f->profile.resident_saved_ms - b->profile.resident_saved_ms, 5.0, 1e-9);
  // And the model's part is not counted: below 80 / 3 ms per layer (the model predicts K = 3
  // faster too: no CPU update and no streaming for those layers).
  EXPECT_LT(b->profile.resident_saved_ms, 80.0 / 3);
  EXPECT_NE(bench_prediction_text(*b).find("resident saving: "), std::string::npos);
  // The K = 0 device check is unchanged by the term (the profile's windows are K = 0's).
  ASSERT_FALSE(b->checks.empty());
  EXPECT_DOUBLE_EQ(b->checks[0].predicted_ms, without->checks[0].predicted_ms);

  // A resident run slower than the model says: clamped at 0, and said so.
  const Json slow = report(device_run(179.9, 3));
  auto c = predict_bench(base, cfg, MachineSpec{}, &slow);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->profile.resident_saved_ms, 0);
  EXPECT_NE(c->profile.resident_saved_measured_by.find("clamped at 0"), std::string::npos);
}

TEST(ResidentSaving, FromBenchRefusesRunsThatDoNotPair) {
  const model::ModelConfig cfg = four_layers();
  const Json base = report(device_run(180, 0));
  const Json none = report(device_run(140, 0));            // no resident layer
  const Json other_batch = report(device_run(140, 3, 4));  // another batch
  const Json other_seq = report(device_run(140, 3), 512);  // another sequence length
  for (const Json* r : {&none, &other_batch, &other_seq}) {
    auto b = predict_bench(base, cfg, MachineSpec{}, r);
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << r->dump();
  }
  // The profile itself comes from a K = 0 run: a resident device run as the profile is refused.
  auto b = predict_bench(report(device_run(140, 2)), cfg, MachineSpec{});
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("--from-bench-resident"), std::string::npos);
}

TEST(ResidentSaving, JsonRoundTripsAndOldDocumentsReadZero) {
  const model::ModelConfig cfg = four_layers();
  const Json resident = report(device_run(140, 3));
  auto b = predict_bench(report(device_run(180, 0)), cfg, MachineSpec{}, &resident);
  ASSERT_TRUE(b.ok());
  const Json j = to_json(b->profile);
  auto back = profile_from_json(j, cfg);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->resident_saved_ms, b->profile.resident_saved_ms);
  EXPECT_EQ(to_json(*back), j);
  Json old = j;
  old.erase("resident_saved_ms");
  old.erase("resident_saved_measured_by");
  auto o = profile_from_json(old, cfg);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->resident_saved_ms, 0);
  Json bad = j;
  bad["resident_saved_ms"] = -1.0;
  EXPECT_FALSE(profile_from_json(bad, cfg).ok());
  // Into a problem at any batch unchanged (per layer and step), and through the problem's JSON
  // only when set.
  for (int batch : {2, 8}) {
    auto p = analytic_problem(cfg, MachineSpec{}, {.batch_size = batch, .seq_len = 256},
                              {.gpu_gb = 1e6, .host_gb = 1e6});
    ASSERT_TRUE(p.ok());
    EXPECT_FALSE(to_json(*p).contains("resident_saved_ms"));
    ASSERT_TRUE(apply_profile(*back, *p).ok());
    EXPECT_EQ(p->resident_saved_ms, b->profile.resident_saved_ms);
    auto q = problem_from_json(to_json(*p));
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    EXPECT_EQ(q->resident_saved_ms, p->resident_saved_ms);
  }
}

// The evaluator subtracts saved x K after the optimizer's max; the MILP's objective agrees.
TEST(ResidentSaving, EvaluatorAndMilpSubtractItPerResidentLayer) {
  std::mt19937_64 rng(20261217);
  for (int n = 0; n < 8; ++n) {
    PlanProblem p = testing::random_problem(rng, 4, false, 1.0);
    for (LayerCost& c : p.layers) c.resident_gb = 0.01;
    for (int k : {0, 1, 3}) {
      PlanProblem a = at_resident(p, k);
      auto plain = solve_milp(a, SolveOptions{.time_limit_s = 30});
      ASSERT_TRUE(plain.ok()) << plain.status().to_string();
      a.resident_saved_ms = 2.5;
      auto saved = solve_milp(a, SolveOptions{.time_limit_s = 30});
      ASSERT_TRUE(saved.ok());
      // A constant at fixed K: the same choice, the step lower by exactly 2.5 x K.
      EXPECT_NEAR(saved->predicted.step_ms, plain->predicted.step_ms - 2.5 * k, 1e-6);
      EXPECT_NEAR(saved->predicted.resident_saved_ms, 2.5 * k, 1e-12);
      EXPECT_NEAR(saved->solver.objective_ms, saved->predicted.objective_ms,
                  1e-6 * std::max(1.0, saved->predicted.objective_ms));
      auto again = evaluate(a, *saved);
      ASSERT_TRUE(again.ok());
      EXPECT_NEAR(again->step_ms, saved->predicted.step_ms, 1e-9);
    }
  }
}

// With the term the search over K values residency more: never a smaller K, and a larger one
// where the model alone saw no gain (the H200 3B case at 40 GiB, session 17).
TEST(ResidentSaving, SearchMakesMoreLayersResidentWhenTheyMeasuredFaster) {
  std::mt19937_64 rng(7);
  int larger = 0;
  for (int n = 0; n < 12; ++n) {
    PlanProblem p = testing::random_problem(rng, 5, false, testing::uniform(rng, 0.5, 1.0));
    for (LayerCost& c : p.layers) c.resident_gb = testing::uniform(rng, 0.01, 0.3);
    const Planner milp = [](const PlanProblem& q) {
      return solve_milp(q, SolveOptions{.time_limit_s = 30});
    };
    auto plain = search_resident(p, milp, kResidentAuto);
    if (!plain.ok()) continue;
    p.resident_saved_ms = 1000;  // far above any other term: every K that fits pays
    auto saved = search_resident(p, milp, kResidentAuto);
    ASSERT_TRUE(saved.ok());
    EXPECT_GE(saved->plan.resident_layers, plain->plan.resident_layers);
    // The largest K that fits: K + 1 does not (or K is every layer).
    const int k = saved->plan.resident_layers;
    if (k < p.num_layers) {
      EXPECT_FALSE(solve_milp(at_resident(p, k + 1)).ok()) << "K " << k;
    }
    if (saved->plan.resident_layers > plain->plan.resident_layers) ++larger;
  }
  EXPECT_GT(larger, 0);
}

// largest_batch with a fit planner: the same batch and plan as without, the planner asked only at
// the largest fitting batch (and in the walk-down), the fit planner for the doubling/bisection.
TEST(ResidentSaving, BatchSearchWithAFitPlannerFindsTheSameBatch) {
  std::mt19937_64 rng(99);
  for (int n = 0; n < 6; ++n) {
    PlanProblem base = testing::random_problem(rng, 4, false, testing::uniform(rng, 0.3, 0.9));
    for (LayerCost& c : base.layers) c.resident_gb = testing::uniform(rng, 0.01, 0.2);
    // Activations scale with the batch; the rest does not.
    const ProblemAt at = [base](int b) -> Result<PlanProblem> {
      PlanProblem q = base;
      for (double& a : q.boundary_gb) a *= b / 4.0;
      for (LayerCost& c : q.layers) {
        c.fwd_ms *= b / 4.0;
        c.bwd_ms *= b / 4.0;
        c.rec_ms *= b / 4.0;
        c.work_fwd_gb *= b / 4.0;
        c.work_bwd_gb *= b / 4.0;
      }
      q.batch_size = b;
      return q;
    };
    int full_calls = 0, fit_calls = 0;
    const Planner milp = [](const PlanProblem& q) {
      return solve_milp(q, SolveOptions{.time_limit_s = 30});
    };
    const Planner full = [&](const PlanProblem& q) {
      ++full_calls;
      return resident_planner(milp, kResidentAuto, 0)(q);
    };
    const Planner fit = [&](const PlanProblem& q) {
      ++fit_calls;
      return milp(at_resident(q, 0));
    };
    auto plain = largest_batch(at, full, BatchSearchOptions{.max_batch = 64});
    const int plain_calls = full_calls;
    full_calls = 0;
    auto fast = largest_batch(at, full, BatchSearchOptions{.max_batch = 64, .fit_planner = fit});
    ASSERT_EQ(plain.ok(), fast.ok());
    if (!plain.ok()) continue;
    EXPECT_EQ(fast->largest_fitting, plain->largest_fitting);
    EXPECT_EQ(fast->batch, plain->batch);
    EXPECT_NEAR(fast->plan.predicted.objective_ms, plain->plan.predicted.objective_ms,
                1e-6 * std::max(1.0, plain->plan.predicted.objective_ms));
    EXPECT_EQ(fast->plan.resident_layers, plain->plan.resident_layers);
    EXPECT_GT(fit_calls, 0);
    EXPECT_LT(full_calls, plain_calls);
  }
}

}  // namespace
}  // namespace ferry::plan
