// SPDX-License-Identifier: Apache-2.0
// ModelCompute's GEMM input reuse (gemm_input_reuse_default(), model_compute_linear.cpp) with
// bf16 GEMMs, on the host: each activation that several GEMMs read is rounded to bf16 once per
// pass (q/k/v share h1, gate/up share h2, forward and backward), the SwiGLU kernel writes the down
// projection's bf16 operand itself, and a layer's backward right after its own forward reuses that
// copy for the down projection's weight gradient. Checked on two backends:
//   - the CPU backend (no bf16 GEMM: the twin rounds and widens), and
//   - Bf16GemmCpu below, the CPU backend claiming native bf16 GEMMs (it widens bf16 operands
//     itself), so the bf16 views the CUDA path hands cuBLASLt are exercised here too;
// that the loss and every gradient are the same bits with the reuse on and off (whole model, and
// train/stream's per-layer order with recompute), that the counted converts drop by exactly the
// shared ones, and that the reused copy is never stale: a backward of an earlier layer after a
// later forward, and a second backward without a new forward, still give the reuse-off bits
// (either would read another layer's or another tensor's bf16 values if the copy's key or its
// invalidation were wrong). The GPU counterpart is tests/gpu/model_gpu_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "model/model_binding.h"
#include "unit/kernels/forwarding_backend.h"
#include "unit/model/model_compute_test_util.h"

namespace ferry::model {
namespace {

using kernels::Backend;
using testing::Case;
using testing::load_case;

// The CPU backend with "native" bf16 GEMMs (and loss head): bf16 operands are widened (exactly)
// and multiplied in f32.
class Bf16GemmCpu final : public testing::ForwardingBackend {
 public:
  std::string_view name() const override { return "cpu+bf16-gemm"; }
  bool supports(kernels::OpKind op, DType dt) const override {
    if (op == kernels::OpKind::kGemm && dt == DType::kBF16) return true;
    return cpu().supports(op, dt);
  }
  Status gemm(const kernels::GemmArgs& a, mem::Stream& s) override {
    std::vector<float> wa, wb;
    kernels::GemmArgs f = a;
    f.a = widened(a.a, wa);
    f.b = widened(a.b, wb);
    return cpu().gemm(f, s);
  }
  Status cross_entropy(const kernels::CrossEntropyArgs& a, mem::Stream& s) override {
    std::vector<float> wh, ww;
    kernels::CrossEntropyArgs f = a;
    f.hidden = widened(a.hidden, wh);
    f.weight = widened(a.weight, ww);
    return cpu().cross_entropy(f, s);
  }

 private:
  static Backend& cpu() { return kernels::cpu_backend(); }
  static ConstTensorView widened(const ConstTensorView& v, std::vector<float>& buf) {
    if (v.dtype != DType::kBF16) return v;
    EXPECT_TRUE(v.is_contiguous());
    buf.resize(static_cast<std::size_t>(v.numel()));
    EXPECT_TRUE(convert_elements(v.data, v.dtype, buf.data(), DType::kF32, buf.size()));
    ConstTensorView t = v;
    t.data = buf.data();
    t.dtype = DType::kF32;
    return t;
  }
};

// Counts what ModelCompute asks of a backend (wraps either backend above).
class Counting final : public testing::ForwardingBackend {
 public:
  explicit Counting(Backend& inner) : testing::ForwardingBackend(inner), inner_(inner) {}
  std::string_view name() const override { return "counting"; }
  Status convert(const kernels::ConvertArgs& a, mem::Stream& s) override {
    if (a.in.dtype == DType::kF32 && a.out.dtype == DType::kBF16) ++casts_down;
    return inner_.convert(a, s);
  }
  Status rms_norm(const kernels::RmsNormArgs& a, mem::Stream& s) override {
    if (a.out16.data != nullptr) ++norm_bf16;
    return inner_.rms_norm(a, s);
  }
  Status swiglu(const kernels::SwiGluArgs& a, mem::Stream& s) override {
    if (a.out16.data != nullptr) ++swiglu_bf16;
    return inner_.swiglu(a, s);
  }
  int casts_down = 0;
  int swiglu_bf16 = 0;
  int norm_bf16 = 0;  // rms_norm calls that wrote the bf16 copy (RmsNormArgs::out16)

 private:
  Backend& inner_;
};

struct Pass {
  double loss = 0.0;
  testing::Grads grads;
  std::uint64_t converts = 0;  // ModelCompute::gemm_input_converts()
  int casts_down = 0, swiglu_bf16 = 0, norm_bf16 = 0;
};

std::unique_ptr<ModelCompute> make(Case& c, Backend& be, int work_layers, bool reuse) {
  auto mc =
      ModelCompute::create(c.m->geometry, c.T, be, work_layers, nullptr, GemmPrecision::kBf16);
  EXPECT_TRUE(mc.ok()) << mc.status().to_string();
  if (!mc.ok()) return nullptr;
  (*mc)->set_gemm_input_reuse(reuse);
  EXPECT_EQ((*mc)->gemm_input_reuse(), reuse);
  return std::move(*mc);
}

// The counters of a finished pass (mc's and be's) into r, with the gradients.
void collect(Pass& r, const GradStorage& grads, const ModelCompute& mc, const Counting& be) {
  r.grads = testing::grads_of(grads);
  r.converts = mc.gemm_input_converts();
  r.casts_down = be.casts_down;
  r.swiglu_bf16 = be.swiglu_bf16;
  r.norm_bf16 = be.norm_bf16;
}

// Whole-model forward + backward.
Pass whole_model(Case& c, Backend& inner, bool reuse) {
  Pass r;
  Counting be(inner);
  auto mc = make(c, be, -1, reuse);
  auto grads = GradStorage::create(*c.m);
  EXPECT_TRUE(grads.ok());
  if (!mc || !grads.ok()) return r;
  r.loss = testing::forward_backward(*mc, c, (*grads)->grads);
  collect(r, **grads, *mc, be);
  return r;
}

// train/stream's order: forward every layer (one workspace), the head, then per layer from the
// top a recompute forward and the backward. Also the loss of the first head_forward.
Pass per_layer(Case& c, Backend& inner, bool reuse) {
  Pass r;
  Counting be(inner);
  auto mc = make(c, be, 1, reuse);
  auto grads = GradStorage::create(*c.m);
  EXPECT_TRUE(grads.ok());
  if (!mc || !grads.ok()) return r;
  testing::PerLayerRun run(*mc, c, (*grads)->grads);
  run.forward();
  r.loss = run.loss();
  for (int l = c.m->geometry.layers - 1; l >= 0; --l) {
    run.reforward(l);
    run.backward(l);
  }
  run.embed_backward();
  collect(r, **grads, *mc, be);
  return r;
}

TEST(ModelComputeGemmInput, SameBitsAndFewerConvertsOnTheWholeModelPath) {
  Bf16GemmCpu native;
  for (Backend* inner : {&kernels::cpu_backend(), static_cast<Backend*>(&native)}) {
    for (const char* arch : {"qwen2", "qwen3", "qwen3_moe"}) {
      const std::string what = std::string(arch) + " on " + std::string(inner->name());
      SCOPED_TRACE(what);
      Case c = load_case(arch);
      ASSERT_TRUE(c.m != nullptr);
      const Pass off = whole_model(c, *inner, false);
      const Pass on = whole_model(c, *inner, true);
      testing::expect_same(on, off, what);
      EXPECT_EQ(off.swiglu_bf16, 0);
      EXPECT_EQ(off.norm_bf16, 0);
      EXPECT_LT(on.converts, off.converts);
      EXPECT_LT(on.casts_down, off.casts_down);
      // The counter counts exactly the activation roundings that disappeared (the other casts:
      // dy, weights, the loss head, attention, are the same on both paths).
      EXPECT_EQ(off.casts_down - on.casts_down, static_cast<int>(off.converts - on.converts));
      const DecoderGeometry& geo = c.m->geometry;
      int dense = 0;
      for (bool moe : geo.layer_is_moe) dense += moe ? 0 : 1;
      // Every layer's forward has its attention norm write h1's bf16 copy, a dense layer's its
      // MLP norm h2's too (an MoE layer's experts read gathered rows).
      EXPECT_EQ(on.norm_bf16, geo.layers + dense);
      if (dense == geo.layers) {
        // Per dense layer, forward: 7 roundings (q, k, v, o, gate, up, down) -> 1 (attn; the
        // norms write h1's and h2's, the SwiGLU kernel down's); backward: 7 -> 4 (act, h2, attn,
        // h1), and 3 for the last layer, whose act copy is still there from the forward.
        const auto L = static_cast<std::uint64_t>(geo.layers);
        EXPECT_EQ(off.converts, 14 * L);
        EXPECT_EQ(on.converts, 1 * L + 4 * L - 1);
        EXPECT_EQ(on.swiglu_bf16, geo.layers);
      } else {
        EXPECT_GT(on.swiglu_bf16, 0);
      }
    }
  }
}

TEST(ModelComputeGemmInput, SameBitsAndFewerConvertsInTheRecomputeOrder) {
  Bf16GemmCpu native;
  for (Backend* inner : {&kernels::cpu_backend(), static_cast<Backend*>(&native)}) {
    for (const char* arch : {"qwen2", "qwen3_moe"}) {
      const std::string what = std::string(arch) + " on " + std::string(inner->name());
      SCOPED_TRACE(what);
      Case c = load_case(arch);
      ASSERT_TRUE(c.m != nullptr);
      const Pass off = per_layer(c, *inner, false);
      const Pass on = per_layer(c, *inner, true);
      testing::expect_same(on, off, what);
      // The per-layer path gives the whole-model path's bits.
      testing::expect_same(on, whole_model(c, *inner, true), what + " vs whole model");
      if (std::string(arch) == "qwen2") {
        // Two forwards and one backward per layer: 21 roundings -> 1 + 1 + 3 (the norms write
        // h1's and h2's copies in each forward; the backward's act is reused every time: each
        // backward follows its own recompute).
        const auto L = static_cast<std::uint64_t>(c.m->geometry.layers);
        EXPECT_EQ(off.converts, 21 * L);
        EXPECT_EQ(on.converts, 5 * L);
        EXPECT_EQ(on.norm_bf16, 4 * c.m->geometry.layers);
      } else {
        EXPECT_LT(on.converts, off.converts);
      }
    }
  }
}

// The reused copy must be the right one. Two layer workspaces: forward layers 0 and 1, then layer
// 0's backward (gemm.x16 holds layer 1's act: must not be read), then layer 1's backward twice
// (the second after the first overwrote gemm.x16 with h2 and h1: must not be read either).
TEST(ModelComputeGemmInput, NeverReadsAStaleCopy) {
  Bf16GemmCpu native;
  for (Backend* inner : {&kernels::cpu_backend(), static_cast<Backend*>(&native)}) {
    SCOPED_TRACE(std::string(inner->name()));
    Case c = load_case("qwen2");
    ASSERT_TRUE(c.m != nullptr);
    ASSERT_GE(c.m->geometry.layers, 2);
    const int L = c.m->geometry.layers;
    Pass runs[2];
    for (bool reuse : {false, true}) {
      Counting be(*inner);
      auto mc = make(c, be, 2, reuse);
      ASSERT_TRUE(mc != nullptr);
      auto grads = GradStorage::create(*c.m);
      ASSERT_TRUE(grads.ok());
      testing::PerLayerRun run(*mc, c, (*grads)->grads);
      ASSERT_TRUE(run.forward());
      // Layers 0 and 1 (workspaces 0 and 1) forwarded last: layer 0 backward first.
      ASSERT_TRUE(run.reforward(0));
      ASSERT_TRUE(run.reforward(1));
      ASSERT_TRUE(run.backward(0));
      ASSERT_TRUE(run.reforward(1));
      ASSERT_TRUE(run.backward(1));
      ASSERT_TRUE(run.backward(1));
      runs[reuse ? 1 : 0].grads = testing::grads_of(**grads);
      runs[reuse ? 1 : 0].converts = mc->gemm_input_converts();
    }
    testing::expect_same(runs[1], runs[0], "stale-copy order");
    // L + 3 forwards save 6 roundings each (q/k/v, gate/up from the norms' copies, down from the
    // SwiGLU's); the backwards 3 each, and 4 for the one that reused the copy: layer 1's first
    // (layer 0's found layer 1's copy, layer 1's second found h1's rounding in gemm.x16).
    const auto forwards = static_cast<std::uint64_t>(L + 3);
    EXPECT_EQ(runs[0].converts - runs[1].converts, 6u * forwards + 3u + 4u + 3u);
  }
}

// f32 GEMMs round nothing either way; the switch changes nothing there.
TEST(ModelComputeGemmInput, F32GemmsConvertNothing) {
  Case c = load_case("qwen2");
  ASSERT_TRUE(c.m != nullptr);
  for (bool reuse : {false, true}) {
    Counting be(kernels::cpu_backend());
    auto mc = ModelCompute::create(c.m->geometry, c.T, be, -1, nullptr, GemmPrecision::kF32);
    ASSERT_TRUE(mc.ok());
    (*mc)->set_gemm_input_reuse(reuse);
    auto grads = GradStorage::create(*c.m);
    ASSERT_TRUE(grads.ok());
    ASSERT_TRUE((*mc)->forward(c.m->params, c.batch).ok());
    ASSERT_TRUE((*mc)->backward(c.m->params, c.batch, (*grads)->grads).ok());
    EXPECT_EQ((*mc)->gemm_input_converts(), 0u);
    EXPECT_EQ(be.swiglu_bf16, 0);
    EXPECT_EQ(be.norm_bf16, 0);
  }
}

}  // namespace
}  // namespace ferry::model
