// SPDX-License-Identifier: Apache-2.0
// The device optimizer tail on the link and in the serial part (docs/plan.md, "the tail on the
// link"): the tail's H2D bytes per layer it updates are charged to the forward window before that
// layer (device_tail_h2d_gb), beside the window's weight prefetch, in the evaluator and the MILP
// alike; layer 0's update before the forward is the device's with the tail on, not the CPU's
// share step_fixed_ms holds (device_tail_serial_ms). Every expected number is derived in the
// comments; the random families hold the search to solving every K exactly and count the
// instances where the link changes the chosen K.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "plan/device_tail.h"
#include "plan/evaluate.h"
#include "plan/exact.h"
#include "plan/milp.h"
#include "plan/plan_json.h"
#include "plan/resident.h"
#include "tests/unit/plan/plan_test_util.h"
#include "tests/unit/plan/planners.h"

namespace ferry::plan {
namespace {

using testing::exact_planner;
using testing::milp_planner;

constexpr double kTieMs = 1e-9;

// Four layers, the CPU 60 ms per layer (measured) after 100 ms of globals, the device 43 ms per
// layer and 0.5 GB up per layer (plan_test_util.h's tail_four_layers, with the bytes given).
PlanProblem four_layers() {
  PlanProblem p = testing::tail_four_layers();
  p.device_update_h2d_gb_per_layer = 0.5;
  return p;
}

void expect_windows(const PlanProblem& p, const std::vector<double>& fwd_gb) {
  const std::vector<double> got = device_tail_h2d_gb(p);
  ASSERT_EQ(got.size(), static_cast<std::size_t>(p.num_windows()));
  for (int t = 0; t < p.num_windows(); ++t) {
    const double want = t < p.num_layers ? fwd_gb[t] : 0.0;
    EXPECT_EQ(got[t], want) << "window " << window_name(p, t);
  }
}

// Which layers the device claims (device_tail_gate_test HandComputedMeetingPoint): K = all: 0, 1,
// 2 (the CPU 3); K = 2: 0, 1; K = 1: 0. Layer j > 0's bytes go to f(j-1); layer 0's are serial.
TEST(DeviceTailLink, BytesGoToTheWindowBeforeEachDeviceLayer) {
  PlanProblem p = four_layers();
  p.device_update_layers = 0;
  expect_windows(p, {0, 0, 0, 0});
  p.device_update_layers = 4;
  expect_windows(p, {0.5, 0.5, 0, 0});
  p.device_update_layers = 2;
  expect_windows(p, {0.5, 0, 0, 0});
  p.device_update_layers = 1;
  expect_windows(p, {0, 0, 0, 0});
  // One resident layer: the tail claims 1 (43), 2 (86), 3 (129) before the CPU is free (its
  // globals take 100 ms): every tail layer's bytes go to the window before it, f0 included.
  p.resident_layers = 1;
  p.device_update_layers = 4;
  expect_windows(p, {0.5, 0.5, 0.5, 0});
  // Derived bytes: the layer's share of the host state, host_fixed_gb 10 over weights 4 x 1 +
  // head 1 = 2 GB per layer, which also gives the derived time (2 GB at 40 GB/s = 50 ms).
  for (LayerCost& c : p.layers) c.weight_gb = 1;
  p.head_weight_gb = 1;
  p.host_fixed_gb = 10;
  p.link.h2d_gbps = 40;
  p.device_update_h2d_gb_per_layer = 0;
  p.device_update_ms_per_layer = 0;
  EXPECT_NEAR(device_tail_layer_h2d_gb(p, 2), 2.0, 1e-12);
  EXPECT_NEAR(device_update_layer_ms(p, 2), 50.0, 1e-12);
}

// Two layers by hand, one plan (max span 1, no host room: all boundaries on the GPU):
//   fwd 10, bwd 20, loss 5 ms; weights 0.2 GB per layer, head 0.1; links 20 GB/s each way, duplex
//   40 (30 loaded); CPU: layer 0 20 ms, layer 1 50 ms (measured), globals 100 (cpu_optimizer_ms
//   170); step_fixed_ms 20 (layer 0's CPU share); the device 20 ms per layer, `gb` up per layer.
// The device claims 0 (done 20) and, the CPU busy with its globals until 100, 1 (done 40):
// U_1 = 20; its bytes go to f0 beside layer 1's 0.2 GB of weights.
PlanProblem two_layers(double gb) {
  PlanProblem p;
  p.num_layers = 2;
  p.boundary_gb = {0.1, 0.1, 0.1};
  for (int j = 0; j < 2; ++j) {
    p.layers.push_back({.fwd_ms = 10,
                        .bwd_ms = 20,
                        .rec_ms = 10,
                        .weight_gb = 0.2,
                        .grad_gb = 0.2,
                        .work_fwd_gb = 0.1,
                        .work_bwd_gb = 0.1,
                        .optimizer_ms = j == 0 ? 20.0 : 50.0});
  }
  p.loss_ms = 5;
  p.loss_work_gb = 0.1;
  p.head_weight_gb = p.head_grad_gb = 0.1;
  p.step_fixed_ms = 20;
  p.cpu_optimizer_ms = 170;
  p.link = {.h2d_gbps = 20, .d2h_gbps = 20, .duplex_gbps = 40, .duplex_loaded_gbps = 30};
  p.gpu_cap_gb = 100;
  p.host_fixed_gb = 1;
  p.host_cap_gb = 1;
  p.gpu_fixed_gb = 1;
  p.max_span = 1;
  p.device_update_ms_per_layer = 20;
  p.device_update_h2d_gb_per_layer = gb;
  p.batch_size = p.seq_len = 1;
  p.model_flops_per_step = 1e12;
  p.source = "hand";
  return p;
}

Plan all_gpu(int L) {
  Plan plan;
  plan.num_layers = L;
  plan.homes.assign(L + 1, Home::kGpu);
  for (int j = 0; j < L; ++j) plan.spans.push_back({j, j + 1, false});
  return plan;
}

TEST(DeviceTailLink, EvaluatorChargesTheSharedLink) {
  // K = 2 with 0.6 GB per layer: f0 moves 0.2 + 0.6 GB up, 40 ms at 20 GB/s against 10 ms of
  // compute: 30 ms exposed (the old model: 0.2 GB, 10 ms, nothing). The loss window exposes 5
  // (layer 1's 0.2 GB in 10 ms against 5). gpu step = compute 65 + exposed 35 + serial 20 (layer
  // 0: the device's 20 ms for the CPU's 20) = 120; f1 starts at 40 >= U_1 = 20: no wait; the
  // phase max(40, 100) = 100 under it: step 120.
  PlanProblem p = at_device_tail(two_layers(0.6), 2);
  auto r = evaluate(p, all_gpu(2));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_NEAR(r->window_exposed_ms[0], 30, 1e-9);
  EXPECT_NEAR(r->exposed_ms, 35, 1e-9);
  EXPECT_NEAR(r->device_tail_serial_ms, 0, 1e-12);
  EXPECT_NEAR(r->optimizer_wait_ms, 0, 1e-9);
  EXPECT_NEAR(r->step_ms, 120, 1e-9);
  // No bytes (none given, none derived): f0 hides its weights, f1 waits 20 - 10 = 10 ms, the step
  // max(65 + 5 + 20 + 10, 100) = 100.
  PlanProblem q = at_device_tail(two_layers(0), 2);
  q.host_fixed_gb = 0;
  q.host_cap_gb = 0;
  auto s = evaluate(q, all_gpu(2));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_NEAR(s->window_exposed_ms[0], 0, 1e-9);
  EXPECT_NEAR(s->optimizer_wait_ms, 10, 1e-9);
  EXPECT_NEAR(s->step_ms, 100, 1e-9);
  // The MILP prices the one plan the same.
  for (const PlanProblem* x : {&p, &q}) {
    auto m = solve_milp(*x);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto e = evaluate(*x, *m);
    ASSERT_TRUE(e.ok());
    EXPECT_NEAR(m->solver.objective_ms, e->objective_ms, 1e-6);
    EXPECT_NEAR(e->step_ms, x == &p ? 120 : 100, 1e-6);
  }
}

// With 3 GB per layer the tail's bytes cost more than the wait they save: f0 needs 3.2 GB, 160 ms
// (150 exposed), so K = 2 steps 65 + 155 + 20 = 240 (no wait: f1 starts at 160). K = 1 (the
// device only layer 0, before the forward: no bytes in windows): the CPU updates layer 1 after
// its globals, done 150, U_1 = 130, f1 waits 120: 65 + 5 + 20 + 120 = 210 (phase max(20, 150)).
// K = 0: U_1 = 50, wait 40: 130, under the phase 170: 170. So K = 0. Without the bytes K = 2
// (100, above) wins: the link changes the choice, and the exact search agrees.
TEST(DeviceTailLink, TheLinkChangesTheChosenK) {
  PlanProblem p = two_layers(3.0);
  const double want[] = {170, 210, 240};
  for (int k = 0; k <= 2; ++k) {
    auto e = solve_exact(at_device_tail(p, k));
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_NEAR(e->best.predicted.step_ms, want[k], 1e-6) << "K " << k;
  }
  for (const Planner& solve : {exact_planner(), milp_planner()}) {
    auto s = search_device_tail(p, solve);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(s->plan.device_update_layers, 0);
    EXPECT_NEAR(s->plan.predicted.step_ms, 170, 1e-6);
  }
  PlanProblem q = two_layers(0);
  q.host_fixed_gb = q.host_cap_gb = 0;
  auto s = search_device_tail(q, milp_planner());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->plan.device_update_layers, 2);
  EXPECT_NEAR(s->plan.predicted.step_ms, 100, 1e-6);
}

// Layer 0's update before the forward with the tail on is the device's (item 3 of the tail's
// weaknesses): with the CPU 50 ms on layer 0 (step_fixed_ms 50 holds it) a device at 20 ms saves
// 30 ms of serial time, one at 80 ms costs 30 more; with a resident layer the tail starts above
// it and the serial part is the resident update's (resident_serial_ms), unchanged by the tail.
TEST(DeviceTailLink, LayerZeroIsTheDevicesUpdate) {
  PlanProblem p = two_layers(0);
  p.host_fixed_gb = p.host_cap_gb = 0;
  p.layers[0].optimizer_ms = 50;
  p.cpu_optimizer_ms = 200;
  p.step_fixed_ms = 50;
  auto off = evaluate(p, all_gpu(2));
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->device_tail_serial_ms, 0.0);
  for (double d : {20.0, 80.0}) {
    PlanProblem q = at_device_tail(p, 1);
    q.device_update_ms_per_layer = d;
    EXPECT_NEAR(device_tail_serial_ms(q), d - 50, 1e-12);
    auto on = evaluate(q, all_gpu(2));
    ASSERT_TRUE(on.ok());
    EXPECT_NEAR(on->device_tail_serial_ms, d - 50, 1e-12);
    EXPECT_NEAR(on->gpu_step_ms - off->gpu_step_ms, d - 50, 1e-9);
    auto m = solve_milp(q);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_NEAR(m->solver.objective_ms, m->predicted.objective_ms, 1e-6);
    // Through the plan's JSON.
    Plan plan = all_gpu(2);
    plan.device_update_layers = 1;
    plan.predicted = *on;
    auto back = plan_from_json(plan_to_json(plan, &q));
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->predicted, plan.predicted);
  }
  // step_fixed_ms below layer 0's share (a profile's measured serial part): only what it holds.
  PlanProblem small = at_device_tail(p, 1);
  small.step_fixed_ms = 10;
  EXPECT_NEAR(device_tail_serial_ms(small), 20 - 10, 1e-12);
  PlanProblem resident = at_device_tail(at_resident(p, 1), 1);
  EXPECT_EQ(device_tail_serial_ms(resident), 0.0);
}

TEST(DeviceTailLink, ProblemJsonCarriesTheBytes) {
  PlanProblem p = four_layers();
  p.device_update_layers = 2;
  auto back = problem_from_json(to_json(p));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->device_update_h2d_gb_per_layer, 0.5);
  EXPECT_EQ(device_tail_h2d_gb(*back), device_tail_h2d_gb(p));
  p.device_update_h2d_gb_per_layer = 0;
  EXPECT_FALSE(to_json(p).contains("device_update_h2d_gb_per_layer"));
  p.device_update_h2d_gb_per_layer = -1;
  EXPECT_FALSE(validate(p).ok());
}

// Random 2-4 layer instances with a binding optimizer and a device at least as fast as the CPU per
// layer, priced with the tail's bytes (drawn: 1-4x the device's time at the H2D rate) and
// without them (0): the search with the exact
// solver gives every K's exact optimum both ways, the MILP's search the same objective, and the
// bytes change the chosen K in some instances (counted, with how many moved to a smaller K: the
// bytes grow with K, but a K that ends the tail earlier also moves fewer of them, so the
// direction is not assumed).
TEST(DeviceTailLink, SearchEqualsEveryKExactlyWithAndWithoutTheLink) {
  std::mt19937_64 rng(20261210);
  std::mt19937_64 rng_tail(20261211);
  int feasible = 0, changed = 0, smaller = 0;
  for (int n = 0; n < 24; ++n) {
    const int L = 2 + n % 3;
    PlanProblem p = testing::random_problem(rng, L, false, testing::uniform(rng, 0.3, 1.0));
    double fwd = 0;
    for (const LayerCost& c : p.layers) fwd += c.fwd_ms;
    p.cpu_optimizer_ms = fwd * testing::uniform(rng_tail, 2.0, 6.0);
    p.device_update_ms_per_layer = p.cpu_optimizer_ms / L * testing::uniform(rng_tail, 0.3, 1.0);
    p.device_update_staging_gb = testing::uniform(rng_tail, 0.0, 0.3);
    // Bytes whose time at the H2D rate is 1-4x the device's time per layer (an H2D-bound tail
    // moves about its time's worth: 1.87 GB at ~45 GB/s in 43 ms at 7B on the H200).
    const double gb = p.device_update_ms_per_layer * 1e-3 * p.link.h2d_gbps *
                      testing::uniform(rng_tail, 1.0, 4.0);
    SCOPED_TRACE(::testing::Message() << "instance " << n << " L=" << L << " gb " << gb);
    int best_k[2] = {-1, -1};
    for (int with_link = 0; with_link < 2; ++with_link) {
      PlanProblem q = p;
      q.device_update_h2d_gb_per_layer = with_link ? gb : 0;
      if (!with_link) q.host_fixed_gb = 0;  // nothing derived either
      q.host_cap_gb = std::max(q.host_cap_gb, q.host_fixed_gb);
      double want = std::numeric_limits<double>::infinity();
      for (int k = 0; k <= L; ++k) {
        auto e = solve_exact(at_device_tail(q, k));
        if (e.ok() && e->best.solver.objective_ms < want - kTieMs) {
          want = e->best.solver.objective_ms;
          best_k[with_link] = k;
        }
      }
      auto s = search_device_tail(q, exact_planner());
      if (best_k[with_link] < 0) {
        EXPECT_FALSE(s.ok());
        continue;
      }
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      EXPECT_EQ(s->plan.device_update_layers, best_k[with_link]);
      EXPECT_NEAR(s->plan.predicted.objective_ms, want, 1e-6 * std::max(1.0, want));
      auto m = search_device_tail(q, milp_planner());
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      EXPECT_NEAR(m->plan.predicted.objective_ms, want, 1e-6 * std::max(1.0, want));
    }
    if (best_k[0] < 0 || best_k[1] < 0) continue;
    ++feasible;
    if (best_k[0] != best_k[1]) ++changed;
    if (best_k[1] < best_k[0]) ++smaller;
  }
  EXPECT_GE(feasible, 16);
  EXPECT_GE(changed, 3);
  std::printf("tail on the link: %d feasible, the link changed K in %d (to a smaller K in %d)\n",
              feasible, changed, smaller);
}

}  // namespace
}  // namespace ferry::plan
