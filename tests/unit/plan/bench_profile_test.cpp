// SPDX-License-Identifier: Apache-2.0
// plan/bench_profile: a `ferry bench train` report becomes a measured profile (window time minus
// exposed time per layer, the optimizer's busy time per step), the device run is predicted from
// its own compute + serial part + the optimizer gate, recompute costs what the profile says, and
// the forward windows' wait behind the CPU optimizer (evaluate's optimizer_wait_ms) follows the
// pipeline recurrence.
#include "plan/bench_profile.h"

#include <gtest/gtest.h>

#include "bench_report_util.h"
#include "plan/evaluate.h"
#include "plan/geometry.h"
#include "plan/policies.h"

namespace ferry::plan {
namespace {

constexpr int kL = testing::kBenchLayers;

model::ModelConfig four_layers() { return testing::four_layer_model(); }

// Windows f0..f3, loss, b3..b0: forward 10 ms (+2 exposed), loss 5, backward 30 ms.
Json policy(const std::string& name, double step_ms, double exposed_ms) {
  return testing::bench_run(name, step_ms, {{"exposed_ms_per_step", exposed_ms}});
}

Json report(std::vector<Json> policies) { return testing::bench_report(std::move(policies)); }

TEST(BenchProfile, ProfileFromTheDeviceRunAndPredictionsPerPolicy) {
  const model::ModelConfig cfg = four_layers();
  // Windows sum to 4 * 12 + 5 + 4 * 30 = 173 ms; the device step took 180: serial part 7 ms.
  const Json r = report({policy("device", 180, 8), policy("every:2", 230, 8),
                         policy("host", 200, 30), policy("every:2:host", 250, 9)});
  auto b = predict_bench(r, cfg, MachineSpec{});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_EQ(b->profile.layers.size(), static_cast<std::size_t>(kL));
  EXPECT_DOUBLE_EQ(b->profile.layers[1].fwd_ms, 10.0);
  EXPECT_DOUBLE_EQ(b->profile.layers[1].bwd_ms, 30.0);
  EXPECT_DOUBLE_EQ(b->profile.layers[1].rec_ms, 10.0);
  // The backward window's re-forward is internals-only: the forward's share at the bench's seq
  // (qwen2.5-0.5b's dense layers, seq 256: below 1); a span recompute stays the full forward.
  const double share = reforward_flop_share(cfg, 1, 256);
  EXPECT_GT(share, 0.5);
  EXPECT_LT(share, 0.9);
  EXPECT_DOUBLE_EQ(b->profile.layers[1].reforward_ms, 10.0 * share);
  EXPECT_DOUBLE_EQ(b->profile.loss_ms, 5.0);
  EXPECT_DOUBLE_EQ(b->profile.cpu_optimizer_ms, 100.0);
  EXPECT_DOUBLE_EQ(b->serial_ms, 7.0);
  ASSERT_EQ(b->checks.size(), 3u);  // every:2:host has no planner twin
  const BenchCheck& dev = b->checks[0];
  const BenchCheck& ck = b->checks[1];
  EXPECT_EQ(dev.plan_policy, "all-gpu");
  EXPECT_EQ(ck.plan_policy, "checkpoint-every-2");
  EXPECT_EQ(b->checks[2].plan_policy, "all-host");
  // all-gpu: compute 4 * 10 + 5 + 4 * 30 = 165, serial 7 + layer 0's update (25 of the 100 ms,
  // equal layers), then layers 1..3 each wait 25 - 10 = 15 ms behind the optimizer: 45 ms.
  EXPECT_NEAR(dev.predicted_ms, 165 + 7 + 25 + 45, 1.0);
  // checkpoint-every-2 adds the recompute of layers 0 and 2 (10 ms each), and moves nothing.
  EXPECT_NEAR(ck.predicted_ms - dev.predicted_ms, 20.0, 1.0);
  EXPECT_NEAR(dev.error(), dev.predicted_ms / 180.0 - 1.0, 1e-12);
  const Json j = to_json(*b);
  EXPECT_EQ(j.at("checks").size(), 3u);
  EXPECT_NE(bench_prediction_text(*b).find("checkpoint-every-2"), std::string::npos);
}

TEST(BenchProfile, MeasuredPerLayerOptimizerTimes) {
  const model::ModelConfig cfg = four_layers();
  Json dev = policy("device", 180, 8);
  dev["optimizer_layer_ms"] = {10.0, 20.0, 30.0, 40.0};
  auto b = predict_bench(report({dev}), cfg, MachineSpec{});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->profile.optimizer_layer_ms, (std::vector<double>{10, 20, 30, 40}));
  // Serial 7 + layer 0's measured 10 ms; layer j's forward waits for U_j = 20, 50, 90 ms after
  // f0 starts: f1 held 20 - 10 = 10, f2 held 50 - 30 = 20, f3 held 90 - 60 = 30.
  ASSERT_EQ(b->checks.size(), 1u);
  EXPECT_NEAR(b->checks[0].predicted_ms, 165 + 7 + 10 + 60, 1.0);
  // Through the profile's JSON into another problem.
  auto back = profile_from_json(to_json(b->profile), cfg);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->optimizer_layer_ms, b->profile.optimizer_layer_ms);
  EXPECT_EQ(to_json(*back), to_json(b->profile));
  dev["optimizer_layer_ms"] = {10.0, 20.0};
  EXPECT_FALSE(predict_bench(report({dev}), cfg, MachineSpec{}).ok());
}

TEST(BenchProfile, RefusesAReportWithoutADeviceRunOrOfAnotherModel) {
  const model::ModelConfig cfg = four_layers();
  auto none = predict_bench(report({policy("host", 200, 30)}), cfg, MachineSpec{});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("device"), std::string::npos);
  model::ModelConfig other = cfg;
  other.num_hidden_layers = kL + 1;
  EXPECT_FALSE(predict_bench(report({policy("device", 180, 8)}), other, MachineSpec{}).ok());
}

// The device optimizer tail as a bench run with it measured (docs/plan.md, "the tail on the
// link"): from a policy whose tail updated layers (here a plan=FILE policy beside the tail-free
// device run), the device's pace per layer (busy 0.6 s over 12 units: 50 ms, where one unit's own
// time from its H2D to its D2H is 80 ms with 2 slots overlapping) and its bytes per unit (18 GB
// over 12: 1.5 GB) go into the profile, through its JSON, into the problem.
TEST(BenchProfile, DeviceTailTimeAndBytesFromATailRun) {
  const model::ModelConfig cfg = four_layers();
  Json tail = policy("plan=p.json", 170, 6);
  tail["device_update_units"] = 12;
  tail["device_update_units_per_step"] = 2.4;
  tail["device_update_busy_s"] = 0.6;
  tail["device_update_unit_ms_mean"] = 80.0;
  tail["device_update_h2d_bytes"] = 18e9;
  tail["device_update_slots"] = 2;
  auto b = predict_bench(report({policy("device", 180, 8), tail}), cfg, MachineSpec{});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_DOUBLE_EQ(b->profile.device_update_ms_per_layer, 50.0);
  EXPECT_DOUBLE_EQ(b->profile.device_update_h2d_gb_per_layer, 1.5);
  EXPECT_NE(b->profile.device_update_measured_by.find("plan=p.json"), std::string::npos);
  EXPECT_NE(bench_prediction_text(*b).find("50.00 ms and 1.500 GB"), std::string::npos);
  auto back = profile_from_json(to_json(b->profile), cfg);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(to_json(*back), to_json(b->profile));
  auto p = analytic_problem(cfg, MachineSpec{}, {.batch_size = 4, .seq_len = 256},
                            {.gpu_gb = 1e6, .host_gb = 1e6});
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(apply_profile(*back, *p).ok());
  EXPECT_EQ(p->device_update_ms_per_layer, 50.0);  // per unit: not scaled to batch 4
  EXPECT_EQ(p->device_update_h2d_gb_per_layer, 1.5);
  // A report without the busy time: one unit's own time.
  tail.erase("device_update_busy_s");
  auto mean = predict_bench(report({policy("device", 180, 8), tail}), cfg, MachineSpec{});
  ASSERT_TRUE(mean.ok());
  EXPECT_DOUBLE_EQ(mean->profile.device_update_ms_per_layer, 80.0);
  // Without a tail run: not measured (0, derived by the planner); older profiles read as that.
  auto none = predict_bench(report({policy("device", 180, 8)}), cfg, MachineSpec{});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->profile.device_update_ms_per_layer, 0.0);
  EXPECT_NE(device_update_text(none->profile).find("not measured"), std::string::npos);
  Json old = to_json(b->profile);
  old.erase("device_update_ms_per_layer");
  old.erase("device_update_h2d_gb_per_layer");
  old.erase("device_update_measured_by");
  auto old_back = profile_from_json(old, cfg);
  ASSERT_TRUE(old_back.ok());
  EXPECT_EQ(old_back->device_update_ms_per_layer, 0.0);
  // The device run itself with the tail: its CPU optimizer times are the CPU's share only.
  Json dev_tail = policy("device", 180, 8);
  dev_tail["device_update_units"] = 12;
  auto refused = predict_bench(report({dev_tail}), cfg, MachineSpec{});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("tail"), std::string::npos);
}

// The disk rates the executor got in a run with NVMe homes replace the machine's in the profile
// (the run that moved the most); without one the machine's stay.
TEST(BenchProfile, NvmeRatesFromTheExecutorsDiskCalls) {
  const model::ModelConfig cfg = four_layers();
  MachineSpec machine;
  machine.link.nvme_write_gbps = 1.5;
  machine.link.nvme_read_gbps = 1.25;
  auto none = predict_bench(report({policy("device", 180, 8)}), cfg, machine);
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->profile.link.nvme_write_gbps, 1.5);
  EXPECT_EQ(none->profile.link.nvme_read_gbps, 1.25);
  EXPECT_EQ(none->profile.measured_by.find("NVMe rates"), std::string::npos);
  Json small = policy("plan=a.json", 400, 200), big = policy("plan=b.json", 500, 300);
  small.update(
      {{"nvme_write_bytes_per_step", 1e9}, {"nvme_write_gbps", 9.0}, {"nvme_read_gbps", 8.0}});
  big.update(
      {{"nvme_write_bytes_per_step", 4e9}, {"nvme_write_gbps", 2.75}, {"nvme_read_gbps", 2.5}});
  Json failed = policy("plan=c.json", 500, 300);
  failed.update({{"nvme_write_bytes_per_step", 8e9},
                 {"nvme_write_gbps", 7.0},
                 {"nvme_read_gbps", 7.0},
                 {"error", "out of memory"}});
  auto b = predict_bench(report({policy("device", 180, 8), small, big, failed}), cfg, machine);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->profile.link.nvme_write_gbps, 2.75);
  EXPECT_EQ(b->profile.link.nvme_read_gbps, 2.5);
  EXPECT_NE(b->profile.measured_by.find("NVMe rates: the executor's disk calls in policy "
                                        "plan=b.json (write 2.75 GB/s, read 2.50 GB/s over "
                                        "4.00 GB per step each way)"),
            std::string::npos)
      << b->profile.measured_by;
  // The written profile carries them to the plan's problem.
  auto back = profile_from_json(to_json(b->profile), cfg);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  auto p = analytic_problem(cfg, MachineSpec{}, {.batch_size = 2, .seq_len = 256},
                            {.gpu_gb = 1e6, .host_gb = 1e6});
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(apply_profile(*back, *p).ok());
  EXPECT_EQ(p->link.nvme_write_gbps, 2.75);
  EXPECT_EQ(p->link.nvme_read_gbps, 2.5);
}

TEST(BenchProfile, PolicyNames) {
  EXPECT_EQ(plan_policy_name("device"), "all-gpu");
  EXPECT_EQ(plan_policy_name("host"), "all-host");
  EXPECT_EQ(plan_policy_name("every:4"), "checkpoint-every-4");
  EXPECT_EQ(plan_policy_name("every:4:host"), "");
  EXPECT_EQ(plan_policy_name("nvme:/x"), "");
}

// The optimizer gate alone: no wait when each layer's update is shorter than a forward window,
// the recurrence's wait when it is longer.
TEST(BenchProfile, OptimizerWaitFollowsThePipelineRecurrence) {
  auto cfg = builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(cfg.ok());
  auto p = analytic_problem(*cfg, MachineSpec{}, {.batch_size = 4, .seq_len = 1024},
                            {.gpu_gb = 1e6, .host_gb = 1e6});
  ASSERT_TRUE(p.ok());
  const int L = p->num_layers;
  for (LayerCost& lc : p->layers) lc.fwd_ms = lc.rec_ms = 10, lc.bwd_ms = 20;
  auto policy_pred = [&](double opt_ms) {
    PlanProblem q = *p;
    q.cpu_optimizer_ms = opt_ms;
    auto fp = fixed_policy_by_name("all-gpu", L);
    EXPECT_TRUE(fp.ok());
    auto plan = solve_policy(q, *fp);
    EXPECT_TRUE(plan.ok());
    return plan->predicted;
  };
  EXPECT_NEAR(policy_pred(5.0 * L).optimizer_wait_ms, 0.0, 1e-9);
  // Updates of 30 ms per layer (equal layers): windows 1..L-1 each wait 20 ms beyond their own
  // forward exposure-free 10 ms... the recurrence gives (L - 1) * (30 - 10).
  const Prediction slow = policy_pred(30.0 * L);
  double exposed_fwd = 0;
  for (int j = 0; j < L; ++j) exposed_fwd += slow.window_exposed_ms[j];
  EXPECT_NEAR(exposed_fwd, 0.0, 1e-6);  // analytic links hide the weights at this size
  EXPECT_NEAR(slow.optimizer_wait_ms, (L - 1) * 20.0, 1e-6);
  EXPECT_GE(slow.step_ms, slow.gpu_step_ms + slow.optimizer_wait_ms - 1e-9);
}

}  // namespace
}  // namespace ferry::plan
