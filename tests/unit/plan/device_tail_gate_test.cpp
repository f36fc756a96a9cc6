// SPDX-License-Identifier: Apache-2.0
// The executor's device optimizer tail in the planner's optimizer gate (docs/plan.md, "the
// optimizer gate", and docs/train_gpu_executor.md item 5): the device updates layers 0, 1, ...
// (at most K) while the CPU, after the globals, updates L-1, L-2, ...; optimizer_ready_ms
// simulates where they meet. Every expected number is derived in the comments.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "plan/evaluate.h"
#include "plan/plan_json.h"
#include "plan/problem.h"
#include "tests/unit/plan/plan_test_util.h"

namespace ferry::plan {
namespace {

// optimizer_ready_ms as it was before the device tail (the CPU updates 1, 2, ... after layer 0's
// serial share), kept here verbatim to pin K = 0 to the same doubles.
std::vector<double> cpu_only_ready(const PlanProblem& p) {
  const int L = p.num_layers;
  std::vector<double> ready(L, 0.0);
  double total_w = 0;
  for (const LayerCost& c : p.layers) total_w += c.weight_gb;
  const bool measured = std::all_of(p.layers.begin(), p.layers.end(),
                                    [](const LayerCost& c) { return c.optimizer_ms > 0; });
  if (!measured && (!(p.cpu_optimizer_ms > 0) || !(total_w > 0))) return ready;
  double done = 0;
  for (int j = 1; j < L; ++j) {
    done +=
        measured ? p.layers[j].optimizer_ms : p.cpu_optimizer_ms * p.layers[j].weight_gb / total_w;
    ready[j] = done;
  }
  return ready;
}

TEST(DeviceTailGate, OffIsBitForBitTheCpuOnlyGate) {
  std::mt19937_64 rng(7);
  for (int n = 0; n < 200; ++n) {
    const int L = 1 + n % 9;
    PlanProblem p = testing::random_problem(rng, L, false, 0.5);
    if (n % 3 == 0) {
      for (LayerCost& c : p.layers) c.optimizer_ms = testing::uniform(rng, 0.1, 10);
    }
    if (n % 5 == 0) p.cpu_optimizer_ms = 0;
    p.device_update_ms_per_layer = n % 2 == 0 ? 0.0 : 3.0;  // ignored with the tail off
    const std::vector<double> want = cpu_only_ready(p);
    const std::vector<double> got = optimizer_ready_ms(p);
    ASSERT_EQ(got.size(), want.size());
    for (int j = 0; j < L; ++j) EXPECT_EQ(got[j], want[j]) << "n " << n << " layer " << j;
  }
}

// The hand-computed tests below run testing::tail_four_layers (plan_test_util.h: the ready times
// of each K are worked out beside it).
void expect_ready(const PlanProblem& p, const std::vector<double>& want) {
  const std::vector<double> got = optimizer_ready_ms(p);
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < want.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-9) << "layer " << j;
}

TEST(DeviceTailGate, HandComputedMeetingPoint) {
  PlanProblem p = testing::tail_four_layers();
  ASSERT_TRUE(validate(p).ok());
  p.device_update_layers = 4;
  expect_ready(p, {0, 43, 86, 117});
  p.device_update_layers = 1000;  // more than there are layers: all
  expect_ready(p, {0, 43, 86, 117});
  p.device_update_layers = 2;
  expect_ready(p, {0, 43, 177, 117});
  p.device_update_layers = 1;
  expect_ready(p, {0, 237, 177, 117});
  p.device_update_layers = 0;  // off: the CPU after layer 0's serial share, 60 ms each
  expect_ready(p, {0, 60, 120, 180});
  // The phase (the step's floor): the whole CPU update off; with the tail the later side's end:
  // K = all: max(129, 160) = 160; K = 2: max(86, 220) = 220; K = 1: max(43, 280) = 280.
  EXPECT_EQ(optimizer_phase_ms(p), 340);
  p.device_update_layers = 4;
  EXPECT_NEAR(optimizer_phase_ms(p), 160, 1e-9);
  p.device_update_layers = 2;
  EXPECT_NEAR(optimizer_phase_ms(p), 220, 1e-9);
  p.device_update_layers = 1;
  EXPECT_NEAR(optimizer_phase_ms(p), 280, 1e-9);
}

TEST(DeviceTailGate, FastDeviceTakesEveryLayer) {
  // The device 1 ms per layer, the CPU busy 100 ms with the globals: the device takes all four
  // layers (done 1, 2, 3, 4) before the CPU is free; ready (0, 1, 2, 3).
  PlanProblem p = testing::tail_four_layers();
  p.device_update_layers = 4;
  p.device_update_ms_per_layer = 1;
  expect_ready(p, {0, 1, 2, 3});
  EXPECT_NEAR(optimizer_phase_ms(p), 100, 1e-9);  // the CPU's globals end the phase
}

TEST(DeviceTailGate, DerivedDeviceTimeIsTheStateShareOverH2d) {
  // host_fixed_gb 10 over weights 4 x 1 + head 1 = 5: 2 GB per layer at 40 GB/s = 50 ms.
  PlanProblem p = testing::tail_four_layers();
  for (LayerCost& c : p.layers) c.weight_gb = 1;
  p.head_weight_gb = 1;
  p.host_fixed_gb = 10;
  p.link.h2d_gbps = 40;
  p.device_update_ms_per_layer = 0;
  EXPECT_NEAR(device_update_layer_ms(p, 2), 50, 1e-12);
  p.device_update_ms_per_layer = 43;
  EXPECT_EQ(device_update_layer_ms(p, 2), 43);
}

TEST(DeviceTailGate, JsonRoundTripAndValidate) {
  PlanProblem p = testing::tail_four_layers();
  // Off and no device time: the problem's JSON has no tail keys (problems without the tail
  // serialize as before).
  p.device_update_ms_per_layer = 0;
  EXPECT_FALSE(to_json(p).contains("device_update_layers"));
  EXPECT_FALSE(to_json(p).contains("device_update_ms_per_layer"));
  p.device_update_layers = 3;
  p.device_update_ms_per_layer = 41.5;
  auto back = problem_from_json(to_json(p));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->device_update_layers, 3);
  EXPECT_EQ(back->device_update_ms_per_layer, 41.5);
  EXPECT_EQ(optimizer_ready_ms(*back), optimizer_ready_ms(p));
  p.device_update_layers = -1;
  EXPECT_FALSE(validate(p).ok());
  p.device_update_layers = 1;
  p.device_update_ms_per_layer = -2;
  EXPECT_FALSE(validate(p).ok());
}

TEST(DeviceTailGate, EvaluatorWaitsForTheMeetingPoint) {
  // The gate with the tail is the same recursion over the new U_j: the evaluator's wait for the
  // all-GPU plan equals max_k (U_k - sum_{m<k} (fwd_m + exposed_m)) with U from the tail.
  PlanProblem p = testing::tail_four_layers();
  p.gpu_cap_gb = 1e6;
  p.device_update_layers = 2;
  Plan plan;
  plan.num_layers = 4;
  plan.homes.assign(5, Home::kGpu);
  for (int j = 0; j < 4; ++j) plan.spans.push_back({j, j + 1, false});
  auto r = evaluate(p, plan);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const std::vector<double> u = optimizer_ready_ms(p);
  double before = 0, wait = 0;
  for (int k = 0; k < 4; ++k) {
    wait = std::max(wait, u[k] - before);
    before += p.layers[k].fwd_ms + r->window_exposed_ms[p.fwd_window(k)];
  }
  EXPECT_NEAR(r->optimizer_wait_ms, wait, 1e-9);
  EXPECT_GT(r->optimizer_wait_ms, 100);  // U_2 = 177 against a few ms of forward
}

TEST(DeviceTailGate, PlanDocumentCarriesThePhase) {
  // ferry plan / ferry train --plan auto write the problem's optimizer phase next to the plan's
  // prediction (what tests/cli/plan_tail.sh compares between the two): 340 ms off, 160 with
  // K = all (HandComputedMeetingPoint); a plan without its problem has none, and reading the
  // document back ignores it.
  PlanProblem p = testing::tail_four_layers();
  p.gpu_cap_gb = 1e6;
  Plan plan;
  plan.num_layers = 4;
  plan.homes.assign(5, Home::kGpu);
  for (int j = 0; j < 4; ++j) plan.spans.push_back({j, j + 1, false});
  auto r = evaluate(p, plan);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  plan.predicted = *r;
  EXPECT_EQ(plan_to_json(plan, &p)["predicted"]["optimizer_phase_ms"].get<double>(), 340);
  EXPECT_FALSE(plan_to_json(plan, nullptr)["predicted"].contains("optimizer_phase_ms"));
  p.device_update_layers = 4;
  const Json j = plan_to_json(plan, &p);
  EXPECT_NEAR(j["predicted"]["optimizer_phase_ms"].get<double>(), 160, 1e-9);
  auto back = plan_from_json(j);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->predicted, plan.predicted);
}

}  // namespace
}  // namespace ferry::plan
