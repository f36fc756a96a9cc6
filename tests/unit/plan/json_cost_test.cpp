// SPDX-License-Identifier: Apache-2.0
// Plan JSON round trip, the analytic cost model on published geometries, measured-profile override.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>

#include "plan/cost_model.h"
#include "plan/geometry.h"
#include "plan/milp.h"
#include "plan/plan_json.h"
#include "plan/policies.h"
#include "plan/profile.h"
#include "tests/unit/plan/plan_test_util.h"

namespace ferry::plan {
namespace {

TEST(PlanJson, RoundTripsExactlyThroughTextAndFile) {
  std::mt19937_64 rng(3);
  PlanProblem p = testing::random_problem(rng, 5, true, 0.2);
  p.host_cap_gb = p.host_fixed_gb + 1.5;
  // A GPU budget just above the smallest that fits forces offloading, so the plan has transfers.
  auto min_gpu = min_capacity(p, Tier::kGpu);
  ASSERT_TRUE(min_gpu.ok()) << min_gpu.status().to_string();
  p.gpu_cap_gb = min_gpu->capacity_gb + 0.05;
  // An optimizer long enough to hold the forward windows, so its fields round-trip non-zero.
  double fwd = 0;
  for (const LayerCost& c : p.layers) fwd += c.fwd_ms;
  p.cpu_optimizer_ms = 3 * fwd;
  auto plan = solve_milp(p);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  ASSERT_FALSE(plan->transfers.empty()) << "want a plan with transfers to round-trip";
  ASSERT_GT(plan->predicted.optimizer_wait_ms, 0);
  const std::string text = plan_to_json(*plan, &p).dump(1);
  auto j = parse_json(text, "test");
  ASSERT_TRUE(j.ok());
  auto back = plan_from_json(*j);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, *plan);
  auto prob = plan_problem_from_json(*j);
  ASSERT_TRUE(prob.ok() && prob->has_value());
  EXPECT_EQ(to_json(**prob), to_json(p));
  EXPECT_EQ(plan_to_json(*back, &**prob).dump(1), text);

  const std::string path = ::testing::TempDir() + "/ferry_plan_roundtrip.json";
  ASSERT_TRUE(write_plan_file(path, *plan, &p).ok());
  auto from_file = read_plan_file(path);
  ASSERT_TRUE(from_file.ok());
  EXPECT_EQ(*from_file, *plan);
  std::remove(path.c_str());

  // A plan written before the optimizer's fields existed still reads (zeros: no wait recorded).
  Json old = *j;
  old["predicted"].erase("optimizer_wait_ms");
  old["predicted"].erase("optimizer_bound_ms");
  old["predicted"].erase("window_optimizer_wait_ms");
  auto old_plan = plan_from_json(old);
  ASSERT_TRUE(old_plan.ok()) << old_plan.status().to_string();
  EXPECT_EQ(old_plan->predicted.optimizer_wait_ms, 0);
  EXPECT_EQ(old_plan->predicted.window_optimizer_wait_ms,
            std::vector<double>(plan->predicted.window_gpu_gb.size(), 0.0));

  Json bad = *j;
  bad["transfers"][0]["direction"] = "sideways";
  EXPECT_EQ(plan_from_json(bad).status().code(), StatusCode::kCorrupt);
  bad = *j;
  bad.erase("spans");
  EXPECT_EQ(plan_from_json(bad).status().code(), StatusCode::kCorrupt);
}

// Kept internals in the plan document: "keep_internals" is always L flags 0/1 (the executor reads
// it), reads back to the same Plan; old documents without it and true/false flags read too.
TEST(PlanJson, KeptInternalsRoundTrip) {
  std::mt19937_64 rng(4);
  PlanProblem p = testing::random_problem(rng, 4, false, 0.8);
  testing::add_keep_costs(rng, p, 0.1, 0.3);
  p.gpu_cap_gb += 0.5;  // room for some internals
  auto plan = solve_milp(p);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  ASSERT_GT(plan->num_kept(), 0) << "want a plan that keeps internals";
  const Json j = plan_to_json(*plan, &p);
  ASSERT_TRUE(j.at("keep_internals").is_array());
  ASSERT_EQ(j.at("keep_internals").size(), 4u);
  for (int l = 0; l < 4; ++l) EXPECT_EQ(j.at("keep_internals")[l].get<int>(), plan->keeps(l));
  EXPECT_GT(j.at("predicted").at("kept_internals_gb").get<double>(), 0);
  auto back = plan_from_json(*parse_json(j.dump(1), "test"));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, *plan);
  auto prob = plan_problem_from_json(j);
  ASSERT_TRUE(prob.ok() && prob->has_value());
  EXPECT_EQ(to_json(**prob), to_json(p));
  // true/false is read as well; all false is "nothing kept" (the empty vector solvers write).
  Json bools = j;
  for (Json& v : bools["keep_internals"]) v = v.get<int>() == 1;
  auto from_bools = plan_from_json(bools);
  ASSERT_TRUE(from_bools.ok()) << from_bools.status().to_string();
  EXPECT_EQ(from_bools->keep_internals, plan->keep_internals);
  Json none = j;
  none["keep_internals"] = Json::array({0, 0, 0, 0});
  auto from_none = plan_from_json(none);
  ASSERT_TRUE(from_none.ok());
  EXPECT_TRUE(from_none->keep_internals.empty());
  Json old = j;
  old.erase("keep_internals");
  old["predicted"].erase("kept_internals_gb");
  auto from_old = plan_from_json(old);
  ASSERT_TRUE(from_old.ok()) << from_old.status().to_string();
  EXPECT_TRUE(from_old->keep_internals.empty());
  // A plan without keeps writes L zeros.
  Plan plain = *plan;
  plain.keep_internals.clear();
  EXPECT_EQ(plan_to_json(plain).at("keep_internals"), Json::array({0, 0, 0, 0}));
  // Wrong length or values are refused.
  Json bad = j;
  bad["keep_internals"] = Json::array({1, 0});
  EXPECT_EQ(plan_from_json(bad).status().code(), StatusCode::kCorrupt);
  bad["keep_internals"] = Json::array({2, 0, 0, 0});
  EXPECT_EQ(plan_from_json(bad).status().code(), StatusCode::kCorrupt);
  // Integers that only truncate to 0/1 in an int (2^32 + 1, 2^32, -(2^32) + 1).
  for (const std::int64_t v :
       {std::int64_t{4294967297}, std::int64_t{4294967296}, std::int64_t{-4294967295}}) {
    bad["keep_internals"] = Json::array({v, 0, 0, 0});
    EXPECT_EQ(plan_from_json(bad).status().code(), StatusCode::kCorrupt) << v;
  }
}

TEST(CostModel, Qwen7bCountsMatchThePublishedShape) {
  auto cfg = builtin_geometry("qwen2.5-7b");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto p = analytic_problem(*cfg, MachineSpec{}, TrainShape{.batch_size = 8, .seq_len = 1024},
                            Capacities{.gpu_gb = 80, .host_gb = 256});
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->num_layers, 28);
  // Boundary: B*S*C bf16.
  EXPECT_DOUBLE_EQ(p->boundary_gb[5], 8.0 * 1024 * 3584 * 2 / 1e9);
  // Layer weights: q,k,v (+bias), o, gate, up, down, 2 norms.
  const double layer = 3584.0 * 3584 + 3584 + 2 * (3584.0 * 512 + 512) + 3584.0 * 3584 +
                       3 * 3584.0 * 18944 + 2 * 3584;
  EXPECT_DOUBLE_EQ(p->layers[0].weight_gb, layer * 2 / 1e9);
  // 7.62 B parameters (published): 6 N B S.
  EXPECT_NEAR(p->model_flops_per_step / (6.0 * 8 * 1024), 7.6156e9, 0.001e9);
  // Host state: 16 bytes per parameter.
  EXPECT_NEAR(p->host_fixed_gb, 7.6156e9 * 16 / 1e9, 0.02);
  // Forward GEMMs at 700 TFLOP/s dominate a layer's forward: 2 * N * params / rate < fwd.
  const double gemm_ms = 2 * 8192 * (layer - 2 * 3584) / 700e12 * 1e3;
  EXPECT_GT(p->layers[0].fwd_ms, gemm_ms);
  EXPECT_LT(p->layers[0].fwd_ms, 1.5 * gemm_ms);
  EXPECT_GT(p->layers[0].bwd_ms, 2.5 * p->layers[0].fwd_ms);
  EXPECT_FALSE(builtin_geometry("qwen9-999b").ok());
}

TEST(Profile, OverridesTimesAndRatesScaledByBatch) {
  auto cfg = builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(cfg.ok());
  auto p = analytic_problem(*cfg, MachineSpec{}, TrainShape{.batch_size = 8, .seq_len = 512},
                            Capacities{.gpu_gb = 24, .host_gb = 64});
  ASSERT_TRUE(p.ok());
  Profile prof;
  prof.machine = "test-gpu";
  prof.geometry = geometry_key(*cfg);
  prof.batch_size = 4;
  prof.seq_len = 512;
  prof.measured_by = "unit test";
  prof.link = LinkRates{20, 21, 30, 25, 0, 0};
  for (int j = 0; j < 24; ++j) prof.layers.push_back({1.0 + j, 3.0 + j, 1.5 + j, 1.2 + j});
  prof.loss_ms = 7;
  prof.cpu_optimizer_ms = 123;
  const std::string path = ::testing::TempDir() + "/ferry_profile.json";
  ASSERT_TRUE(write_profile(path, prof).ok());
  auto back = read_profile(path, *cfg);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(to_json(*back), to_json(prof));
  EXPECT_DOUBLE_EQ(back->layers[3].reforward_ms, 4.2);
  std::remove(path.c_str());
  ASSERT_TRUE(apply_profile(*back, *p).ok());
  EXPECT_DOUBLE_EQ(p->layers[3].fwd_ms, 2 * 4.0);  // measured at batch 4, planned at 8
  EXPECT_DOUBLE_EQ(p->layers[3].bwd_ms, 2 * 6.0);
  EXPECT_DOUBLE_EQ(p->layers[3].rec_ms, 2 * 4.5);
  // A keep saves the measured internals-only re-forward, not the recompute (rec_ms).
  EXPECT_DOUBLE_EQ(p->layers[3].keep_saved_ms, 2 * 4.2);
  EXPECT_DOUBLE_EQ(p->loss_ms, 14);
  EXPECT_DOUBLE_EQ(p->link.h2d_gbps, 20);
  EXPECT_DOUBLE_EQ(p->cpu_optimizer_ms, 123);
  // A profile written before "reforward_ms" existed: rec_ms x the geometry's share at the
  // profile's seq (dense: below rec_ms), and the keep saves that.
  Json old = to_json(prof);
  for (Json& l : old["layers"]) l.erase("reforward_ms");
  auto old_prof = profile_from_json(old, *cfg);
  ASSERT_TRUE(old_prof.ok()) << old_prof.status().to_string();
  const double share = reforward_flop_share(*cfg, 3, 512);
  EXPECT_LT(share, 0.9);
  EXPECT_DOUBLE_EQ(old_prof->layers[3].reforward_ms, 4.5 * share);
  EXPECT_DOUBLE_EQ(old_prof->layers[3].rec_ms, 4.5);
  ASSERT_TRUE(apply_profile(*old_prof, *p).ok());
  EXPECT_DOUBLE_EQ(p->layers[3].keep_saved_ms, 2 * 4.5 * share);
  // ... and a re-forward longer than the backward is capped at the backward.
  prof.layers[3].reforward_ms = 7;
  ASSERT_TRUE(apply_profile(prof, *p).ok());
  EXPECT_DOUBLE_EQ(p->layers[3].keep_saved_ms, 2 * 6.0);
  prof.seq_len = 1024;
  EXPECT_FALSE(apply_profile(prof, *p).ok());
  EXPECT_NE(default_profile_path("h200", prof.geometry).find("plan/h200__qwen2-L24-"),
            std::string::npos);
}

}  // namespace
}  // namespace ferry::plan
