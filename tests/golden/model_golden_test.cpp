// SPDX-License-Identifier: Apache-2.0
// Golden tests: ferry's whole-model forward and backward against Hugging Face transformers 5.17.
// The fixtures (tests/data/models/<arch>/, made by tools/fixtures/make_model_fixtures.py in
// float64 and stored as float32) hold the model files and the expected logits, loss and every
// parameter gradient for a packed batch of 3 sequences with masked targets.
// Tolerances (issue F1): logits and loss within 1e-4 relative, gradients within 1e-3 relative
// norm-wise. Runs on both the reference backend and the CPU backend.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"
#include "model/model_binding.h"
#include "model/safetensors.h"
#include "model_fixtures.h"

namespace ferry::model {
namespace {

std::string fixture_dir(const std::string& arch) { return testing::model_fixture_dir(arch); }

std::vector<float> to_f32(const ConstTensorView& v) { return testing::fixture_to_f32(v); }

// ||a - b|| / ||b|| over all elements.
double rel_norm_diff(const float* a, const float* b, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Case {
  std::string arch;
  std::string backend;
};

class ModelGolden : public ::testing::TestWithParam<Case> {};

TEST_P(ModelGolden, LogitsLossAndGradientsMatchTransformers) {
  const Case c = GetParam();
  kernels::Backend& be =
      c.backend == "reference" ? kernels::reference_backend() : kernels::cpu_backend();
  auto loaded = load_model_f32(fixture_dir(c.arch));
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  LoadedModel& m = **loaded;

  auto expected = SafetensorsFile::open(fixture_dir(c.arch) + "/expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status().to_string();
  auto view = [&](const std::string& name) {
    auto v = expected->view(name);
    EXPECT_TRUE(v.ok()) << name << ": " << v.status().to_string();
    return v.ok() ? *v : ConstTensorView{};
  };
  const ConstTensorView ids = view("input_ids"), positions = view("positions"),
                        cu = view("cu_seqlens"), targets = view("targets");
  const std::int64_t T = ids.numel(), V = m.geometry.vocab;

  auto compute = ModelCompute::create(m.geometry, T, be);
  ASSERT_TRUE(compute.ok()) << compute.status().to_string();
  std::vector<float> logits(static_cast<std::size_t>(T * V)), nll(static_cast<std::size_t>(T));
  const PackedBatch batch{.ids = ids, .positions = positions, .cu_seqlens = cu, .targets = targets};
  auto fwd = (*compute)->forward(
      m.params, batch, TensorView::contiguous(nll.data(), DType::kF32, Device::kCpu, {T}),
      TensorView::contiguous(logits.data(), DType::kF32, Device::kCpu, {T, V}));
  ASSERT_TRUE(fwd.ok()) << fwd.status().to_string();

  const std::vector<float> want_logits = to_f32(view("logits"));
  ASSERT_EQ(want_logits.size(), logits.size());
  double max_ref = 0, max_err = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(double(want_logits[i])));
    max_err = std::max(max_err, std::fabs(double(logits[i]) - want_logits[i]));
  }
  EXPECT_LE(max_err / max_ref, 1e-4) << c.arch << " logits max abs err " << max_err;
  const double want_loss = to_f32(view("loss"))[0];
  EXPECT_LE(std::fabs(fwd->mean_loss() - want_loss) / std::fabs(want_loss), 1e-4)
      << c.arch << " loss " << fwd->mean_loss() << " vs " << want_loss;

  auto grads = GradStorage::create(m);
  ASSERT_TRUE(grads.ok()) << grads.status().to_string();
  ASSERT_TRUE((*compute)->backward(m.params, batch, (*grads)->grads).ok());
  int compared = 0;
  for (const auto& [name, g] : (*grads)->named) {
    const std::vector<float> want = to_f32(view("grad." + name));
    ASSERT_EQ(want.size(), static_cast<std::size_t>(g.numel())) << name;
    const double rel = rel_norm_diff(g.as<float>(), want.data(), want.size());
    EXPECT_LE(rel, 1e-3) << c.arch << " grad " << name;
    ++compared;
  }
  // Every gradient in the fixture was compared (none silently skipped).
  int in_fixture = 0;
  for (const auto& t : expected->tensors()) in_fixture += t.name.rfind("grad.", 0) == 0;
  EXPECT_EQ(compared, in_fixture) << c.arch;
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (const char* arch :
       {"llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "olmoe", "qwen3_hd128", "llama_hd64"}) {
    for (const char* be : {"reference", "cpu"}) out.push_back({arch, be});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelGolden, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& tp) {
                           return tp.param.arch + "_" + tp.param.backend;
                         });

}  // namespace
}  // namespace ferry::model
