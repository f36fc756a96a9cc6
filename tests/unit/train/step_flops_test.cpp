// SPDX-License-Identifier: Apache-2.0
// The FLOP count behind `ferry train`'s TFLOPS / MFU figures: the 6N parameter count agrees with
// the model's real weight tensors (param_specs, an independent source) for every fixture
// architecture; the attention term counts causal pairs of each packed sequence; recompute shows
// up in the hardware count and not in the model count.
#include "train/step_flops.h"

#include <gtest/gtest.h>

#include "model/config.h"
#include "model/model_binding.h"
#include "model/param_spec.h"
#include "test_util.h"

namespace ferry::train {
namespace {

TEST(StepFlops, ModelParamsMatchTheWeightTensorsOfEveryFixture) {
  for (const char* arch : {"llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "olmoe"}) {
    auto cfg = model::load_model_config(std::string(FERRY_TEST_DATA_DIR) + "/models/" + arch);
    ASSERT_TRUE(cfg.ok()) << arch << ": " << cfg.status().to_string();
    auto geo = model::make_geometry(*cfg);
    ASSERT_TRUE(geo.ok()) << arch;
    // N = every tensor, but of each MoE layer's experts only top_k (what a token passes through).
    double total = 0, experts = 0;
    for (const model::ParamSpec& p : model::param_specs(*cfg)) {
      (model::is_expert_role(p.role) ? experts : total) += double(p.numel());
    }
    if (geo->experts > 0) total += experts * double(geo->top_k) / double(geo->experts);
    const TokenMatmulParams t = token_matmul_params(*geo);
    EXPECT_DOUBLE_EQ(t.model_params, total) << arch;
    EXPECT_DOUBLE_EQ(t.head, double(geo->vocab) * geo->hidden) << arch;
  }
}

TEST(StepFlops, AttentionCountsCausalPairsPerPackedSequence) {
  model::DecoderGeometry g;
  g.heads = 3;
  g.head_dim = 8;
  const std::vector<std::int32_t> one{0, 4};     // 4 + 3 + 2 + 1 = 10 pairs
  const std::vector<std::int32_t> two{0, 2, 4};  // (2 + 1) * 2 = 6 pairs
  EXPECT_DOUBLE_EQ(attention_forward_flops(g, one), 4.0 * 8 * 3 * 10);
  EXPECT_DOUBLE_EQ(attention_forward_flops(g, two), 4.0 * 8 * 3 * 6);
  EXPECT_DOUBLE_EQ(attention_forward_flops(g, std::vector<std::int32_t>{0}), 0.0);
}

TEST(StepFlops, RecomputeCostsHardwareFlopsNotModelFlops) {
  auto cfg = model::load_model_config(std::string(FERRY_TEST_DATA_DIR) + "/models/qwen2");
  ASSERT_TRUE(cfg.ok());
  auto g = model::make_geometry(*cfg);
  ASSERT_TRUE(g.ok());
  const TokenMatmulParams t = token_matmul_params(*g);
  const std::vector<std::int32_t> cu{0, 16, 40};
  const auto L = static_cast<std::uint64_t>(g->layers);
  const StepFlops plain = micro_batch_flops(*g, t, cu, L, L);
  const StepFlops recompute = micro_batch_flops(*g, t, cu, 2 * L, L);
  EXPECT_DOUBLE_EQ(plain.model, 6.0 * t.model_params * 40);
  EXPECT_DOUBLE_EQ(recompute.model, plain.model);
  double layer = 0;
  for (double p : t.layer) layer += p;
  const double extra = 2.0 * layer * 40 + double(L) * attention_forward_flops(*g, cu);
  EXPECT_NEAR(recompute.hardware - plain.hardware, extra, 1e-9 * extra);
}

// An internals-only re-forward (ModelCompute::layer_forward_internals) is priced without a dense
// layer's down projection: 2 * mlp_width * hidden per token less; MoE layers skip no GEMM.
TEST(StepFlops, InternalsOnlyReforwardsSkipTheDownProjection) {
  const std::vector<std::int32_t> cu{0, 16, 40};
  for (const char* arch : {"qwen2", "olmoe"}) {
    auto cfg = model::load_model_config(std::string(FERRY_TEST_DATA_DIR) + "/models/" + arch);
    ASSERT_TRUE(cfg.ok());
    auto g = model::make_geometry(*cfg);
    ASSERT_TRUE(g.ok());
    const TokenMatmulParams t = token_matmul_params(*g);
    const auto L = static_cast<std::uint64_t>(g->layers);
    const StepFlops full = micro_batch_flops(*g, t, cu, 2 * L, L);
    const StepFlops internals = micro_batch_flops(*g, t, cu, 2 * L, L, L);
    EXPECT_DOUBLE_EQ(internals.model, full.model) << arch;
    const double skipped = g->experts > 0 ? 0.0 : double(L) * 2.0 * g->mlp_width * g->hidden * 40;
    EXPECT_NEAR(full.hardware - internals.hardware, skipped, 1e-9 * full.hardware) << arch;
  }
}

TEST(StepFlops, KnownPeaksByDeviceName) {
  EXPECT_DOUBLE_EQ(known_peak_bf16_flops("NVIDIA H200"), 989e12);
  EXPECT_DOUBLE_EQ(known_peak_bf16_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_DOUBLE_EQ(known_peak_bf16_flops("NVIDIA GeForce RTX 3090"), 71e12);
  EXPECT_DOUBLE_EQ(known_peak_bf16_flops("NVIDIA H100 NVL"), 0.0);
  EXPECT_DOUBLE_EQ(known_peak_bf16_flops("some CPU"), 0.0);
}

// The trainer reports the figures: positive TFLOPS, hardware >= model for the streamed executor
// that re-runs every layer's forward before its backward, MFU only with a peak.
TEST(StepFlops, TrainerReportsThroughput) {
  const std::string dir = testing::temp_dir("flops");
  TrainConfig c = testing::tiny_config(dir + "/mem");
  c.max_steps = 2;
  auto mem = run_training(c);
  ASSERT_TRUE(mem.ok()) << mem.status().to_string();
  EXPECT_GT(mem->model_tflops, 0.0);
  EXPECT_GT(mem->hardware_tflops, 0.0);
  EXPECT_EQ(mem->mfu, 0.0);
  EXPECT_GT(mem->host_peak_bytes, 0u);

  c.output_dir = dir + "/stream";
  c.executor = Executor::kStream;
  c.peak_tflops = 1.0;
  auto st = run_training(c);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_GT(st->hardware_tflops / st->model_tflops, mem->hardware_tflops / mem->model_tflops);
  EXPECT_NEAR(st->mfu, st->model_tflops / 1.0, 1e-12);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ferry::train
