// SPDX-License-Identifier: Apache-2.0
// `ferry train --executor stream` end to end on the tiny embedded model: the same losses and the
// same exported weights as the in-memory executor; a run resumed from a checkpoint written by
// the stream executor reproduces the uninterrupted run exactly; a plan file drives it; three
// non-finite steps in a row stop it; a batch over the device budget is refused before training
// starts.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/file_util.h"
#include "test_util.h"
#include "train/stream/plan_policy.h"
#include "train/stream/resident_layers.h"
#include "train/stream/window_report.h"
#include "train/trainer.h"

namespace ferry::train {
namespace {

TrainConfig stream_config(const std::string& out) {
  TrainConfig c = testing::tiny_config(out);
  c.builtin.layers = 3;
  c.max_steps = 6;
  c.grad_accum = 2;
  c.schedule = LrSchedule::kCosine;
  c.warmup_steps = 2;
  c.adamw.max_grad_norm = 0.5;
  c.executor = Executor::kStream;
  c.policy = "every:2:host";
  return c;
}

TEST(StreamTrainer, SameLossesAndWeightsAsTheInMemoryExecutor) {
  const std::string a_dir = testing::temp_dir("st_mem");
  const std::string b_dir = testing::temp_dir("st_stream");
  TrainConfig mem_cfg = stream_config(a_dir);
  mem_cfg.executor = Executor::kMemory;
  auto ra = run_training(mem_cfg);
  ASSERT_TRUE(ra.ok()) << ra.status().to_string();
  auto rb = run_training(stream_config(b_dir));
  ASSERT_TRUE(rb.ok()) << rb.status().to_string();
  EXPECT_EQ(ra->losses, rb->losses);
  EXPECT_GT(rb->device_peak_bytes, 0u);
  // f32 weights + master + m + v + grads = 20, plus page padding of each section.
  EXPECT_GE(rb->host_bytes_per_param, 20.0);
  auto wa = read_file(a_dir + "/model.safetensors");
  auto wb = read_file(b_dir + "/model.safetensors");
  ASSERT_TRUE(wa.ok() && wb.ok());
  EXPECT_TRUE(*wa == *wb) << "exported weights differ";
}

TEST(StreamTrainer, ResumeIsBitExact) {
  const std::string a_dir = testing::temp_dir("st_resume_a");
  const std::string b_dir = testing::temp_dir("st_resume_b");
  auto ra = run_training(stream_config(a_dir));
  ASSERT_TRUE(ra.ok()) << ra.status().to_string();
  {
    TrainConfig b = stream_config(b_dir);
    b.save_every = 3;
    b.keep_checkpoints = 5;
    auto rb = run_training(b);
    ASSERT_TRUE(rb.ok()) << rb.status().to_string();
    std::filesystem::remove(b_dir + "/model.safetensors");
  }
  TrainConfig resumed = stream_config(b_dir);
  resumed.resume = b_dir + "/checkpoint-3";
  auto rc = run_training(resumed);
  ASSERT_TRUE(rc.ok()) << rc.status().to_string();
  testing::expect_resume_reproduces(*ra, a_dir, *rc, b_dir, 3);
}

// bf16 masters on the stream executor: the memory executor's losses and exported weights, and a
// resume from the stream executor's checkpoint reproduces the uninterrupted run.
TEST(StreamTrainer, Bf16MastersMatchMemoryAndResumeExactly) {
  for (const OptimMode mode :
       {OptimMode{.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::kF32},
        OptimMode{.master = MasterWeights::kBf16Sr, .states = OptimizerStates::k8Bit}}) {
    SCOPED_TRACE(describe(mode));
    const std::string tag(to_string(mode.master));
    const std::string mem_dir = testing::temp_dir("st_bf16_mem_" + tag);
    const std::string a_dir = testing::temp_dir("st_bf16_a_" + tag);
    const std::string b_dir = testing::temp_dir("st_bf16_b_" + tag);
    auto config = [&](const std::string& out) {
      TrainConfig c = stream_config(out);
      c.optim = mode;
      return c;
    };
    TrainConfig mem_cfg = config(mem_dir);
    mem_cfg.executor = Executor::kMemory;
    auto rm = run_training(mem_cfg);
    ASSERT_TRUE(rm.ok()) << rm.status().to_string();
    auto ra = run_training(config(a_dir));
    ASSERT_TRUE(ra.ok()) << ra.status().to_string();
    EXPECT_EQ(rm->losses, ra->losses);
    EXPECT_LT(ra->host_bytes_per_param, 20.0);  // smaller than the fp32-master arena
    auto wm = read_file(mem_dir + "/model.safetensors");
    auto wa = read_file(a_dir + "/model.safetensors");
    ASSERT_TRUE(wm.ok() && wa.ok());
    EXPECT_TRUE(*wm == *wa) << "exported weights differ";
    {
      TrainConfig b = config(b_dir);
      b.save_every = 3;
      b.keep_checkpoints = 5;
      ASSERT_TRUE(run_training(b).ok());
      std::filesystem::remove(b_dir + "/model.safetensors");
    }
    TrainConfig resumed = config(b_dir);
    resumed.resume = b_dir + "/checkpoint-3";
    auto rc = run_training(resumed);
    ASSERT_TRUE(rc.ok()) << rc.status().to_string();
    testing::expect_resume_reproduces(*ra, a_dir, *rc, b_dir, 3);
  }
}

// --resident-layers: layers 0..K-1 on the (emulated) device for the whole run give the memory
// executor's losses and exported weights, and a resume from a checkpoint written mid-run (their
// state downloaded into the host arena for it) reproduces the uninterrupted run exactly.
TEST(StreamTrainer, ResidentLayersMatchMemoryAndResumeExactly) {
  const OptimMode mode{.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit};
  const std::string mem_dir = testing::temp_dir("st_res_mem");
  TrainConfig mem_cfg = stream_config(mem_dir);
  mem_cfg.optim = mode;
  mem_cfg.executor = Executor::kMemory;
  auto rm = run_training(mem_cfg);
  ASSERT_TRUE(rm.ok()) << rm.status().to_string();
  auto wm = read_file(mem_dir + "/model.safetensors");
  ASSERT_TRUE(wm.ok());
  for (const int k : {2, stream::kResidentAllLayers}) {
    SCOPED_TRACE(k);
    const std::string tag = std::to_string(k < 0 ? 99 : k);
    const std::string a_dir = testing::temp_dir("st_res_a_" + tag);
    const std::string b_dir = testing::temp_dir("st_res_b_" + tag);
    auto config = [&](const std::string& out) {
      TrainConfig c = stream_config(out);
      c.optim = mode;
      c.resident_layers = k;
      return c;
    };
    auto ra = run_training(config(a_dir));
    ASSERT_TRUE(ra.ok()) << ra.status().to_string();
    EXPECT_EQ(ra->resident_layers, k < 0 ? 3 : k);
    EXPECT_EQ(rm->losses, ra->losses);
    auto wa = read_file(a_dir + "/model.safetensors");
    ASSERT_TRUE(wa.ok());
    EXPECT_TRUE(*wm == *wa) << "exported weights differ";
    {
      TrainConfig b = config(b_dir);
      b.save_every = 3;
      b.keep_checkpoints = 5;
      ASSERT_TRUE(run_training(b).ok());
      std::filesystem::remove(b_dir + "/model.safetensors");
    }
    TrainConfig resumed = config(b_dir);
    resumed.resume = b_dir + "/checkpoint-3";
    auto rc = run_training(resumed);
    ASSERT_TRUE(rc.ok()) << rc.status().to_string();
    testing::expect_resume_reproduces(*ra, a_dir, *rc, b_dir, 3);
  }
  // On the memory executor the flag is refused.
  mem_cfg.resident_layers = 1;
  EXPECT_FALSE(run_training(mem_cfg).ok());
}

// --plan FILE: the homes of a `ferry plan` document drive the executor (same bits again).
TEST(StreamTrainer, RunsThePolicyOfAPlanFile) {
  const std::string a_dir = testing::temp_dir("st_plan_mem");
  const std::string b_dir = testing::temp_dir("st_plan");
  TrainConfig mem_cfg = stream_config(a_dir);
  mem_cfg.executor = Executor::kMemory;
  auto ra = run_training(mem_cfg);
  ASSERT_TRUE(ra.ok()) << ra.status().to_string();
  const std::string plan = b_dir + "/plan.json";
  ASSERT_TRUE(write_file_atomic(plan, R"({"format": "ferry-plan", "version": 1,
    "policy": "solved", "num_layers": 3, "batch_size": 4, "seq_len": 128,
    "boundaries": [{"boundary": 0, "home": "host"}, {"boundary": 1, "home": "nvme"},
                   {"boundary": 2, "home": "recompute"}, {"boundary": 3, "home": "gpu"}],
    "spans": [], "transfers": []})")
                  .ok());
  TrainConfig c = stream_config(b_dir);
  c.plan_file = plan;
  c.nvme_dir = b_dir + "/nvme";
  auto rb = run_training(c);
  ASSERT_TRUE(rb.ok()) << rb.status().to_string();
  EXPECT_EQ(ra->losses, rb->losses);
  c.executor = Executor::kMemory;
  EXPECT_FALSE(run_training(c).ok());  // --plan needs the stream executor
}

// Run-time instrumentation: per compute window (plan numbering) the measured time and exposed
// transfer time, inside the step time; with a plan, its predictions travel into the report.
TEST(StreamTrainer, MeasuresEveryWindowAndReportsThePlansPrediction) {
  const std::string dir = testing::temp_dir("st_windows");
  TrainConfig c = stream_config(dir);
  c.policy = "every:2";
  c.metrics_out = dir + "/metrics.jsonl";
  auto r = run_training(c);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const std::size_t windows = 2 * 3 + 1;
  ASSERT_EQ(r->window_ms.size(), windows);
  ASSERT_EQ(r->window_exposed_ms.size(), windows);
  double sum = 0;
  for (std::size_t t = 0; t < windows; ++t) {
    EXPECT_GT(r->window_ms[t], 0.0) << "window " << t;
    EXPECT_GE(r->window_exposed_ms[t], 0.0);
    EXPECT_LE(r->window_exposed_ms[t], r->window_ms[t]);
    sum += r->window_ms[t];
  }
  // The windows lie inside the steps (the step also has the embedding, globals and the flush).
  EXPECT_LT(sum, r->wall_s * 1e3 / double(c.max_steps));
  auto text = read_file(c.metrics_out);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find(R"("type":"windows")"), std::string::npos);

  stream::WindowReport wr = stream::make_window_report(
      3, 2, {0.002, 0.004, 0.006, 0.008, 0.010, 0.012, 0.014}, {0, 0.001, 0, 0, 0, 0, 0.002}, 0.1);
  EXPECT_DOUBLE_EQ(wr.measured_ms[1], 2.0);
  EXPECT_DOUBLE_EQ(wr.measured_exposed_ms[6], 1.0);
  EXPECT_DOUBLE_EQ(wr.measured_step_ms, 50.0);
  wr.predicted_compute_ms.assign(windows, 1.0);
  wr.predicted_exposed_ms.assign(windows, 0.5);
  wr.predicted_step_ms = 40.0;
  const std::string table = stream::format_window_table(wr);
  for (const char* w : {"f0", "f2", "loss", "b2", "b0", "predicted", "+25.0 %"})
    EXPECT_NE(table.find(w), std::string::npos) << w << " in\n" << table;

  // A plan document's predicted windows are read (and a wrong count refused).
  const std::string doc = R"({"format": "ferry-plan", "version": 1, "policy": "solved",
    "num_layers": 1, "batch_size": 4, "seq_len": 128,
    "boundaries": [{"boundary": 0, "home": "gpu"}, {"boundary": 1, "home": "gpu"}],
    "spans": [], "transfers": [],
    "predicted": {"step_ms": 9.5, "window_compute_ms": [1, 2, 3],
                  "window_exposed_ms": [0.5, 0, 0.25]}})";
  auto pp = stream::plan_policy_from_text(doc, "doc", 1, "");
  ASSERT_TRUE(pp.ok()) << pp.status().to_string();
  EXPECT_EQ(pp->window_compute_ms, (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(pp->window_exposed_ms, (std::vector<double>{0.5, 0, 0.25}));
  EXPECT_DOUBLE_EQ(pp->predicted_step_ms, 9.5);
  std::string bad = doc;
  bad.replace(bad.find("[1, 2, 3]"), 9, "[1, 2]");
  EXPECT_FALSE(stream::plan_policy_from_text(bad, "doc", 1, "").ok());
}

TEST(StreamTrainer, ThreeNonFiniteStepsStop) {
  const std::string out = testing::temp_dir("st_nonfinite");
  TrainConfig c = stream_config(out);
  c.lr = 1e30;  // the first update sends every weight to ~1e30: the next forwards overflow
  c.warmup_steps = 0;
  c.schedule = LrSchedule::kConstant;
  c.adamw.weight_decay = 0.0;
  c.grad_accum = 1;
  c.max_steps = 10;
  auto r = run_training(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stopping at step 4: 3 consecutive steps had non-finite"),
            std::string::npos)
      << r.status().to_string();
}

TEST(StreamTrainer, BatchOverTheDeviceBudgetIsRefusedBeforeTraining) {
  const std::string out = testing::temp_dir("st_budget");
  TrainConfig c = stream_config(out);
  c.batch_size = 64;
  c.device_budget_mib = 1;
  auto r = run_training(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("the largest batch that fits is"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace ferry::train
