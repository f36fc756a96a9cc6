// SPDX-License-Identifier: Apache-2.0
// GemmPrecision::kBf16 (model_compute.h: every linear layer's operands rounded to bf16, f32
// accumulation) on the CPU backend, whose twin widens the rounded operands and multiplies in f32,
// against the reference backend, which multiplies the bf16 operands natively (f64 sums): the
// "naive same-precision implementation" of style.md's tolerance rule. Over every Hugging Face
// fixture of model_golden_test.cpp, with err() measured against transformers (R):
//   err(cpu bf16, R) <= 2 * err(reference bf16, R) + floor
// (floor: the golden f32 tolerances, 1e-4 relative for logits/loss, 1e-3 relative norm per
// gradient). And, so that a precision flag that did nothing, or rounded at other points than the
// native path, cannot pass: the CPU twin is much closer to the native bf16 result than to the
// f32 result (its logits differ from CPU f32 by more than they differ from reference bf16).
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "model/model_binding.h"
#include "model/safetensors.h"
#include "model_fixtures.h"

namespace ferry::model {
namespace {

using testing::rel_max_diff;
using testing::rel_norm_diff;

constexpr double kLogitsFloor = 1e-4;
constexpr double kGradFloor = 1e-3;

struct Results {
  std::vector<float> logits;
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

Results run(kernels::Backend& be, GemmPrecision precision, LoadedModel& m,
            const PackedBatch& batch) {
  Results r;
  const std::int64_t T = batch.ids.numel(), V = m.geometry.vocab;
  auto mc = ModelCompute::create(m.geometry, T, be, -1, nullptr, precision);
  EXPECT_TRUE(mc.ok()) << mc.status().to_string();
  if (!mc.ok()) return r;
  EXPECT_EQ((*mc)->gemm_precision(), precision);
  auto planned = ModelCompute::planned_bytes(m.geometry, T, be, -1, precision);
  EXPECT_TRUE(planned.ok());
  if (planned.ok()) {
    EXPECT_EQ(*planned, (*mc)->total_bytes());
  }
  r.logits.resize(static_cast<std::size_t>(T * V));
  auto fwd =
      (*mc)->forward(m.params, batch, {},
                     TensorView::contiguous(r.logits.data(), DType::kF32, Device::kCpu, {T, V}));
  EXPECT_TRUE(fwd.ok()) << fwd.status().to_string();
  if (!fwd.ok()) return r;
  r.loss = fwd->mean_loss();
  auto grads = GradStorage::create(m);
  EXPECT_TRUE(grads.ok());
  const Status s = (*mc)->backward(m.params, batch, (*grads)->grads);
  EXPECT_TRUE(s.ok()) << s.to_string();
  for (const auto& [name, g] : (*grads)->named) r.grads[name] = testing::fixture_to_f32(g);
  return r;
}

class ModelBf16Gemm : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelBf16Gemm, CpuTwinWithinTheRuleOfNativeBf16) {
  const std::string arch = GetParam();
  const std::string dir = testing::model_fixture_dir(arch);
  auto loaded = load_model_f32(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  LoadedModel& m = **loaded;
  auto expected = SafetensorsFile::open(dir + "/expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status().to_string();
  auto view = [&](const std::string& name) {
    auto v = expected->view(name);
    EXPECT_TRUE(v.ok()) << name;
    return v.ok() ? *v : ConstTensorView{};
  };
  const PackedBatch batch{.ids = view("input_ids"),
                          .positions = view("positions"),
                          .cu_seqlens = view("cu_seqlens"),
                          .targets = view("targets")};
  Results hf;
  hf.logits = testing::fixture_to_f32(view("logits"));
  hf.loss = testing::fixture_to_f32(view("loss"))[0];
  for (const auto& [name, v] : m.named)
    hf.grads[name] = testing::fixture_to_f32(view("grad." + name));

  const Results twin = run(kernels::cpu_backend(), GemmPrecision::kBf16, m, batch);
  const Results naive = run(kernels::reference_backend(), GemmPrecision::kBf16, m, batch);
  const Results f32 = run(kernels::cpu_backend(), GemmPrecision::kF32, m, batch);
  ASSERT_FALSE(HasFailure());

  const double el = rel_max_diff(twin.logits, hf.logits);
  const double el_n = rel_max_diff(naive.logits, hf.logits);
  EXPECT_LE(el, 2 * el_n + kLogitsFloor) << arch << " logits";
  const double eloss = std::fabs(twin.loss - hf.loss) / std::fabs(hf.loss);
  const double eloss_n = std::fabs(naive.loss - hf.loss) / std::fabs(hf.loss);
  EXPECT_LE(eloss, 2 * eloss_n + kLogitsFloor) << arch << " loss";
  double worst = 0;
  for (const auto& [name, want] : hf.grads) {
    const double e = rel_norm_diff(twin.grads.at(name), want);
    const double en = rel_norm_diff(naive.grads.at(name), want);
    EXPECT_LE(e, 2 * en + kGradFloor) << arch << " grad " << name << " (naive " << en << ")";
    worst = std::max(worst, e);
  }
  // Same rounding points as the native path: far closer to it than to f32.
  const double to_native = rel_max_diff(twin.logits, naive.logits);
  const double to_f32 = rel_max_diff(twin.logits, f32.logits);
  EXPECT_GT(to_f32, 0.0) << arch << ": bf16 GEMMs gave the f32 logits";
  EXPECT_LT(to_native, to_f32 / 10) << arch;
  std::cout << "[bf16_gemm] " << arch << ": logits vs transformers " << el << " (native " << el_n
            << "), twin vs native " << to_native << ", twin vs f32 " << to_f32 << ", grads max "
            << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelBf16Gemm,
                         ::testing::Values("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral",
                                           "olmoe"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace ferry::model
