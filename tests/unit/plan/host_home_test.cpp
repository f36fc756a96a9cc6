// SPDX-License-Identifier: Apache-2.0
// The host-home term (PlanProblem::host_home_ms_per_gb, docs/plan.md "the host-home term"): the
// measured per-step cost of boundaries homed off the GPU. From a bench report's device and host
// runs (bench_profile.h), through the profile's JSON, into the solvers: with memory for every
// boundary on the GPU the plan homes them all there and keeps internals only where memory is left
// (the H200 3B case at 40 GiB, session 16); with memory tight it still homes boundaries in host
// memory (the term is a cost, never a constraint). Random instances: milp_exact_test.cpp.
#include <gtest/gtest.h>

#include "bench_report_util.h"
#include "plan/bench_profile.h"
#include "plan/evaluate.h"
#include "plan/exact.h"
#include "plan/geometry.h"
#include "plan/milp.h"
#include "plan/policies.h"
#include "plan/profile.h"

namespace ferry::plan {
namespace {

// ---- from a bench report -------------------------------------------------------------------

constexpr int kL = testing::kBenchLayers;

model::ModelConfig four_layers() { return testing::four_layer_model(); }

Json policy(const std::string& name, double step_ms, double act_bytes, int batch = 2) {
  return testing::bench_run(
      name, step_ms,
      {{"batch_size", batch}, {"exposed_ms_per_step", 8.0}, {"act_bytes_per_step", act_bytes}});
}

Json report(std::vector<Json> policies) { return testing::bench_report(std::move(policies)); }

const BenchCheck& check(const BenchPrediction& b, const std::string& policy) {
  for (const BenchCheck& c : b.checks) {
    if (c.policy == policy) return c;
  }
  ADD_FAILURE() << "no check for " << policy;
  return b.checks.front();
}

TEST(HostHome, FromBenchDerivesTheTermFromDeviceAndHostRuns) {
  const model::ModelConfig cfg = four_layers();
  // The host run homed 3 GB (6e9 bytes both ways) and took 20 ms longer than the device run.
  auto without =
      predict_bench(report({policy("device", 180, 0), policy("host", 200, 0)}), cfg, MachineSpec{});
  auto b = predict_bench(report({policy("device", 180, 0), policy("host", 200, 6e9)}), cfg,
                         MachineSpec{});
  ASSERT_TRUE(without.ok() && b.ok()) << b.status().to_string();
  // Without the bytes moved there is nothing to divide by: 0, not measured.
  EXPECT_EQ(without->profile.host_home_ms_per_gb, 0);
  EXPECT_TRUE(without->profile.host_home_measured_by.empty());
  // The model's own host - device difference (exposure of its transfers) is not counted twice.
  const double modelled =
      check(*without, "host").predicted_ms - check(*without, "device").predicted_ms;
  EXPECT_LT(modelled, 20);
  EXPECT_NEAR(b->profile.host_home_ms_per_gb, (20 - modelled) / 3.0, 1e-9);
  EXPECT_GT(b->profile.host_home_ms_per_gb, 0);
  EXPECT_NE(b->profile.host_home_measured_by.find("3.00 GB homed"), std::string::npos)
      << b->profile.host_home_measured_by;
  // Every policy is priced with it: all-gpu unchanged, all-host pays it on its L boundaries
  // (0..L-1: the embedding's output too, as the executor's host policy homes it).
  EXPECT_NEAR(check(*b, "device").predicted_ms, check(*without, "device").predicted_ms, 1e-9);
  auto prob = analytic_problem(cfg, MachineSpec{},
                               {.batch_size = 2,
                                .seq_len = 256,
                                .grad_bytes_per_param = 4,
                                .weight_bytes_per_param = 4,
                                .activation_bytes = 4},
                               {.gpu_gb = 1e6, .host_gb = 1e6});
  ASSERT_TRUE(prob.ok());
  double homed_gb = 0;
  for (int i = 0; i < kL; ++i) homed_gb += prob->boundary_gb[i];
  EXPECT_NEAR(check(*b, "host").predicted_ms - check(*without, "host").predicted_ms,
              b->profile.host_home_ms_per_gb * homed_gb, 1e-6);
  const std::string text = bench_prediction_text(*b);
  EXPECT_NE(text.find("host homes: "), std::string::npos) << text;
  EXPECT_NE(text.find("not a check"), std::string::npos) << text;

  // A host run faster than the model's difference: clamped at 0, and said so.
  auto fast = predict_bench(report({policy("device", 180, 0), policy("host", 170, 6e9)}), cfg,
                            MachineSpec{});
  ASSERT_TRUE(fast.ok());
  EXPECT_EQ(fast->profile.host_home_ms_per_gb, 0);
  EXPECT_NE(fast->profile.host_home_measured_by.find("clamped at 0"), std::string::npos);
}

TEST(HostHome, FromBenchWithoutAHostRunAtTheSameBatchIsZero) {
  const model::ModelConfig cfg = four_layers();
  auto alone = predict_bench(report({policy("device", 180, 0)}), cfg, MachineSpec{});
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(alone->profile.host_home_ms_per_gb, 0);
  EXPECT_TRUE(alone->profile.host_home_measured_by.empty());
  EXPECT_NE(bench_prediction_text(*alone).find("--policies device,host"), std::string::npos);
  auto other_batch = predict_bench(report({policy("device", 180, 0), policy("host", 300, 6e9, 3)}),
                                   cfg, MachineSpec{});
  ASSERT_TRUE(other_batch.ok());
  EXPECT_EQ(other_batch->profile.host_home_ms_per_gb, 0);
}

TEST(HostHome, ProfileJsonRoundTripAndOldProfiles) {
  const model::ModelConfig cfg = four_layers();
  auto b = predict_bench(report({policy("device", 180, 0), policy("host", 200, 6e9)}), cfg,
                         MachineSpec{});
  ASSERT_TRUE(b.ok());
  const Json j = to_json(b->profile);
  auto back = profile_from_json(j, cfg);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->host_home_ms_per_gb, b->profile.host_home_ms_per_gb);
  EXPECT_EQ(back->host_home_measured_by, b->profile.host_home_measured_by);
  EXPECT_EQ(to_json(*back), j);
  // Per GB: the same at any batch (boundary bytes scale with the batch, the cost per GB not).
  for (int batch : {2, 8}) {
    auto p = analytic_problem(cfg, MachineSpec{}, {.batch_size = batch, .seq_len = 256},
                              {.gpu_gb = 1e6, .host_gb = 1e6});
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(apply_profile(*back, *p).ok());
    EXPECT_EQ(p->host_home_ms_per_gb, b->profile.host_home_ms_per_gb);
  }
  // A profile written before the term reads as 0 and says it was not measured.
  Json old = j;
  old.erase("host_home_ms_per_gb");
  old.erase("host_home_measured_by");
  auto o = profile_from_json(old, cfg);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->host_home_ms_per_gb, 0);
  EXPECT_NE(host_home_text(*o).find("not measured"), std::string::npos);
  Json bad = j;
  bad["host_home_ms_per_gb"] = -1.0;
  EXPECT_FALSE(profile_from_json(bad, cfg).ok());
}

TEST(HostHome, ProblemJsonCarriesTheTermOnlyWhenSet) {
  PlanProblem p;
  p.num_layers = 1;
  p.boundary_gb = {0.1, 0.1};
  p.layers = {LayerCost{.fwd_ms = 1, .bwd_ms = 2, .rec_ms = 1}};
  p.link = LinkRates{10, 10, 20, 20, 0, 0};
  p.gpu_cap_gb = p.host_cap_gb = 10;
  EXPECT_FALSE(to_json(p).contains("host_home_ms_per_gb"));
  p.host_home_ms_per_gb = 6.5;
  auto back = problem_from_json(to_json(p));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->host_home_ms_per_gb, 6.5);
  p.host_home_ms_per_gb = -1;
  EXPECT_FALSE(validate(p).ok());
}

// ---- in the solvers --------------------------------------------------------------------------

// Four layers, max span 1 (no recompute: every boundary has a home), links fast enough to hide
// every transfer (1000 GB/s: 1 ms per GB against windows of 5..15 ms). Interior boundaries 1 GB
// each, kept internals 1 GB per layer saving 3.5 ms of re-forward each. Without the term, homing a
// boundary in host memory is free and frees GPU memory for a keep; with it at 10 ms per GB, a keep
// (3.5 ms) never pays for the host home that makes room for it.
PlanProblem four_layer_keeps(double host_home_ms_per_gb) {
  PlanProblem p;
  p.num_layers = 4;
  p.boundary_gb = {0.2, 1, 1, 1, 0.2};
  for (int j = 0; j < 4; ++j) {
    p.layers.push_back(LayerCost{.fwd_ms = 5,
                                 .bwd_ms = 15,
                                 .rec_ms = 5,
                                 .weight_gb = 0.01,
                                 .grad_gb = 0.01,
                                 .internals_gb = 1.0,
                                 .keep_saved_ms = 3.5});
  }
  p.loss_ms = 5;
  p.head_weight_gb = p.head_grad_gb = 0.01;
  p.link = LinkRates{1000, 1000, 2000, 2000, 0, 0};
  p.gpu_fixed_gb = 1;
  p.host_cap_gb = 100;
  p.max_span = 1;
  p.host_home_ms_per_gb = host_home_ms_per_gb;
  p.batch_size = p.seq_len = 1;
  p.model_flops_per_step = 1e12;
  p.source = "hand";
  return p;
}

double gpu_need(const PlanProblem& p, const std::string& policy) {
  auto fp = fixed_policy_by_name(policy, p.num_layers);
  EXPECT_TRUE(fp.ok());
  PlanProblem big = p;
  big.gpu_cap_gb = 1e6;
  auto plan = solve_policy(big, *fp);
  EXPECT_TRUE(plan.ok());
  return plan->predicted.gpu_peak_gb;
}

int host_homes(const Plan& plan) {
  int n = 0;
  for (Home h : plan.homes) n += h == Home::kHost ? 1 : 0;
  return n;
}

// GB of boundaries homed in host memory (boundary 0, the embedding's output, included).
double host_homed_gb(const PlanProblem& p, const Plan& plan) {
  double gb = 0;
  for (int i = 0; i <= p.num_layers; ++i) gb += plan.homes[i] == Home::kHost ? p.boundary_gb[i] : 0;
  return gb;
}

TEST(HostHome, RoomForEveryBoundaryOnTheGpuHomesThemThereAndKeepsWhatIsLeft) {
  PlanProblem free_homes = four_layer_keeps(0);
  // Room for every boundary on the GPU plus 1.5 GB: one more kept layer in the windows where the
  // boundaries peak, more where some are offloaded.
  free_homes.gpu_cap_gb = gpu_need(free_homes, "all-gpu") + 1.5;
  PlanProblem costly = free_homes;
  costly.host_home_ms_per_gb = 10;

  auto milp0 = solve_milp(free_homes);
  auto exact0 = solve_exact(free_homes);
  ASSERT_TRUE(milp0.ok() && exact0.ok());
  EXPECT_NEAR(milp0->solver.objective_ms, exact0->best.solver.objective_ms, 1e-6);
  // Without the term the optimum homes boundaries in host memory to keep more layers (what the
  // 40 GiB 3B plan did: 31 of 36 boundaries off the GPU for 4 keeps).
  EXPECT_GT(host_homes(*milp0), 0);

  auto milp = solve_milp(costly);
  auto exact = solve_exact(costly);
  ASSERT_TRUE(milp.ok() && exact.ok()) << milp.status().to_string();
  EXPECT_NEAR(milp->solver.objective_ms, exact->best.solver.objective_ms, 1e-6);
  EXPECT_EQ(host_homes(*milp), 0);
  EXPECT_EQ(milp->predicted.host_home_ms, 0);
  for (Home h : milp->homes) EXPECT_EQ(h, Home::kGpu);
  // It keeps where memory is left beside the boundaries, and fewer layers than with free homes.
  EXPECT_GT(milp->num_kept(), 0);
  EXPECT_LT(milp->num_kept(), milp0->num_kept());
  EXPECT_TRUE(check_fits(costly, milp->predicted).ok());
  // The free-homes plan, priced with the term, is slower than the plan solved with it.
  auto old_plan = evaluate(costly, *milp0);
  ASSERT_TRUE(old_plan.ok());
  EXPECT_GT(old_plan->step_ms, milp->predicted.step_ms);
  EXPECT_NEAR(old_plan->host_home_ms, 10.0 * host_homed_gb(costly, *milp0), 1e-9);
}

TEST(HostHome, TightMemoryStillHomesBoundariesInHostMemory) {
  PlanProblem p = four_layer_keeps(10);
  // Not enough for every boundary on the GPU (and no recompute: max span 1), but for some plan.
  const double all_gpu = gpu_need(p, "all-gpu");
  p.gpu_cap_gb = all_gpu;
  auto least = min_capacity(p, Tier::kGpu);
  ASSERT_TRUE(least.ok()) << least.status().to_string();
  ASSERT_LT(least->capacity_gb, all_gpu - 1.0);
  p.gpu_cap_gb = least->capacity_gb + 0.25;
  auto milp = solve_milp(p);
  auto exact = solve_exact(p);
  ASSERT_TRUE(milp.ok()) << milp.status().to_string();
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  EXPECT_NEAR(milp->solver.objective_ms, exact->best.solver.objective_ms, 1e-6);
  EXPECT_GT(host_homes(*milp), 0);
  EXPECT_NEAR(milp->predicted.host_home_ms, 10.0 * host_homed_gb(p, *milp), 1e-9);
  EXPECT_TRUE(check_fits(p, milp->predicted).ok());
  // The all-host policy fits too and pays the term on its four boundaries (0.2 + 3 x 1 GB).
  auto fp = fixed_policy_by_name("all-host", p.num_layers);
  ASSERT_TRUE(fp.ok());
  auto host = solve_policy(p, *fp);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  EXPECT_NEAR(host->predicted.host_home_ms, 32.0, 1e-9);
  EXPECT_LE(milp->predicted.step_ms, host->predicted.step_ms + 1e-6);
  // all-gpu does not fit here.
  auto gpu_fp = fixed_policy_by_name("all-gpu", p.num_layers);
  ASSERT_TRUE(gpu_fp.ok());
  EXPECT_FALSE(solve_policy(p, *gpu_fp).ok());
}

// Boundary 0 (the embedding's output) may leave the GPU like any other boundary, as the
// executor's host policy homes it: with a cap that only the all-host plan of boundaries 0..L-1
// fits, the solvers find it, and all-host with boundary 0 pinned to the GPU (the planner's rule
// before session 18, one batch less than the executor's host policy at 3B / 24 GiB) does not fit.
TEST(HostHome, BoundaryZeroLeavesTheGpuWhenOnlyThatFits) {
  PlanProblem p = four_layer_keeps(10);
  p.boundary_gb = {1, 1, 1, 1, 0.2};
  p.allow_keep_internals = false;
  auto fp = fixed_policy_by_name("all-host", p.num_layers);
  ASSERT_TRUE(fp.ok());
  EXPECT_EQ(fp->choice.homes[0], Home::kHost);
  EXPECT_EQ(fp->choice.homes[p.num_layers], Home::kGpu);
  std::vector<Home> pinned = fp->choice.homes;  // the same with boundary 0 on the GPU
  pinned[0] = Home::kGpu;
  // The smallest GPU cap each choice fits (its transfers scheduled by the LP), by bisection.
  const auto least_cap = [&](const std::vector<Home>& homes) {
    double lo = 0, hi = 100;
    for (int it = 0; it < 50; ++it) {
      PlanProblem q = p;
      q.gpu_cap_gb = (lo + hi) / 2;
      (solve_fixed(q, homes, fp->choice.spans, "probe").ok() ? hi : lo) = q.gpu_cap_gb;
    }
    return hi;
  };
  const double all_host = least_cap(fp->choice.homes);
  ASSERT_GT(least_cap(pinned), all_host + 0.5);  // boundary 0's GB for the whole step

  p.gpu_cap_gb = all_host + 1e-3;  // above the bisection's last step, below the pinned need
  auto milp = solve_milp(p);
  auto exact = solve_exact(p);
  ASSERT_TRUE(milp.ok()) << milp.status().to_string();
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  EXPECT_NEAR(milp->solver.objective_ms, exact->best.solver.objective_ms, 1e-6);
  EXPECT_EQ(milp->homes[0], Home::kHost);
  EXPECT_TRUE(check_fits(p, milp->predicted).ok());
  // Its transfers move boundary 0 out in the forward and back before the backward of layer 0,
  // and it pays the host-home term on it.
  double out = 0, in = 0;
  for (const Transfer& x : milp->transfers) {
    if (x.boundary != 0) continue;
    (x.to_gpu ? in : out) += x.gb;
    if (x.to_gpu) {
      EXPECT_GE(x.window, p.num_layers);
      EXPECT_LE(x.window, 2 * p.num_layers - 1);
    } else {
      EXPECT_LE(x.window, p.num_layers - 1);
    }
  }
  EXPECT_NEAR(out, 1.0, 1e-6);
  EXPECT_NEAR(in, 1.0, 1e-6);
  EXPECT_NEAR(milp->predicted.host_home_ms, 10.0 * host_homed_gb(p, *milp), 1e-9);
  EXPECT_GE(milp->predicted.host_home_ms, 10.0 - 1e-9);
  // With boundary 0 pinned the cap holds no plan of this choice.
  auto pinned_capped = solve_fixed(p, pinned, fp->choice.spans, "pinned");
  EXPECT_FALSE(pinned_capped.ok());
}

}  // namespace
}  // namespace ferry::plan
