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

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "model/model_binding.h"
#include "model/safetensors.h"
#include "model_fixtures.h"
#include "unit/kernels/forwarding_backend.h"

namespace ferry::model {
namespace {

using kernels::Backend;

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

struct Case {
  std::unique_ptr<LoadedModel> m;
  std::optional<SafetensorsFile> expected;
  PackedBatch batch;
  std::int64_t T = 0;
};

Case load_case(const std::string& arch) {
  Case c;
  auto m = load_model_f32(testing::model_fixture_dir(arch));
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return c;
  c.m = std::move(*m);
  auto e = SafetensorsFile::open(testing::model_fixture_dir(arch) + "/expected.safetensors");
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return c;
  c.expected.emplace(std::move(*e));
  auto view = [&](const char* name) {
    auto v = c.expected->view(name);
    EXPECT_TRUE(v.ok()) << name;
    return v.ok() ? *v : ConstTensorView{};
  };
  c.batch = {.ids = view("input_ids"),
             .positions = view("positions"),
             .cu_seqlens = view("cu_seqlens"),
             .targets = view("targets")};
  c.T = c.batch.ids.numel();
  return c;
}

struct Pass {
  double loss = 0.0;
  std::vector<std::vector<float>> grads;
  std::uint64_t converts = 0;  // ModelCompute::gemm_input_converts()
  int casts_down = 0, swiglu_bf16 = 0, norm_bf16 = 0;
};

std::vector<std::vector<float>> grads_of(const GradStorage& g) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, v] : g.named) {
    const float* p = v.as<float>();
    out.emplace_back(p, p + v.numel());
  }
  return out;
}

void expect_same(const Pass& a, const Pass& b, const std::string& what) {
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size()) << what;
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(a.grads[i].size(), b.grads[i].size());
    EXPECT_EQ(std::memcmp(a.grads[i].data(), b.grads[i].data(), a.grads[i].size() * sizeof(float)),
              0)
        << what << ": gradient " << i;
  }
}

std::unique_ptr<ModelCompute> make(Case& c, Backend& be, int work_layers, bool reuse) {
  auto mc =
      ModelCompute::create(c.m->geometry, c.T, be, work_layers, nullptr, GemmPrecision::kBf16);
  EXPECT_TRUE(mc.ok()) << mc.status().to_string();
  if (!mc.ok()) return nullptr;
  (*mc)->set_gemm_input_reuse(reuse);
  EXPECT_EQ((*mc)->gemm_input_reuse(), reuse);
  return std::move(*mc);
}

// Whole-model forward + backward.
Pass whole_model(Case& c, Backend& inner, bool reuse) {
  Pass r;
  Counting be(inner);
  auto mc = make(c, be, -1, reuse);
  auto grads = GradStorage::create(*c.m);
  EXPECT_TRUE(grads.ok());
  if (!mc || !grads.ok()) return r;
  auto fwd = mc->forward(c.m->params, c.batch);
  EXPECT_TRUE(fwd.ok()) << fwd.status().to_string();
  if (fwd.ok()) r.loss = fwd->loss_sum;
  const Status s = mc->backward(c.m->params, c.batch, (*grads)->grads);
  EXPECT_TRUE(s.ok()) << s.to_string();
  r.grads = grads_of(**grads);
  r.converts = mc->gemm_input_converts();
  r.casts_down = be.casts_down;
  r.swiglu_bf16 = be.swiglu_bf16;
  r.norm_bf16 = be.norm_bf16;
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
  const int L = c.m->geometry.layers;
  const std::int64_t C = c.m->geometry.hidden;
  std::vector<std::vector<float>> x(static_cast<std::size_t>(L + 2),
                                    std::vector<float>(static_cast<std::size_t>(c.T * C)));
  auto xv = [&](int i) {
    return TensorView::contiguous(x[static_cast<std::size_t>(i)].data(), DType::kF32, Device::kCpu,
                                  {c.T, C});
  };
  const ModelParams& p = c.m->params;
  ModelGrads& g = (*grads)->grads;
  EXPECT_TRUE(mc->embed(p.embed, c.batch, xv(0)).ok());
  for (int l = 0; l < L; ++l)
    EXPECT_TRUE(mc->layer_forward(l, p.layers[l], c.batch, xv(l), xv(l + 1)).ok());
  auto head = mc->head_forward(p.final_norm, p.lm_head, c.batch, xv(L));
  EXPECT_TRUE(head.ok());
  if (head.ok()) r.loss = head->loss_sum;
  EXPECT_TRUE(
      mc->head_backward(p.final_norm, p.lm_head, g.final_norm, g.lm_head, c.batch, xv(L)).ok());
  for (int l = L - 1; l >= 0; --l) {
    EXPECT_TRUE(mc->layer_forward(l, p.layers[l], c.batch, xv(l), xv(L + 1)).ok());
    EXPECT_TRUE(mc->layer_backward(l, p.layers[l], g.layers[l], c.batch, xv(l)).ok());
  }
  EXPECT_TRUE(mc->embed_backward(g.embed, c.batch).ok());
  r.grads = grads_of(**grads);
  r.converts = mc->gemm_input_converts();
  r.casts_down = be.casts_down;
  r.swiglu_bf16 = be.swiglu_bf16;
  r.norm_bf16 = be.norm_bf16;
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
      expect_same(on, off, what);
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
      expect_same(on, off, what);
      // The per-layer path gives the whole-model path's bits.
      expect_same(on, whole_model(c, *inner, true), what + " vs whole model");
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
    const std::int64_t C = c.m->geometry.hidden;
    Pass runs[2];
    for (bool reuse : {false, true}) {
      Counting be(*inner);
      auto mc = make(c, be, 2, reuse);
      ASSERT_TRUE(mc != nullptr);
      auto grads = GradStorage::create(*c.m);
      ASSERT_TRUE(grads.ok());
      std::vector<std::vector<float>> x(static_cast<std::size_t>(L + 2),
                                        std::vector<float>(static_cast<std::size_t>(c.T * C)));
      auto xv = [&](int i) {
        return TensorView::contiguous(x[static_cast<std::size_t>(i)].data(), DType::kF32,
                                      Device::kCpu, {c.T, C});
      };
      const ModelParams& p = c.m->params;
      ModelGrads& g = (*grads)->grads;
      ASSERT_TRUE(mc->embed(p.embed, c.batch, xv(0)).ok());
      for (int l = 0; l < L; ++l)
        ASSERT_TRUE(mc->layer_forward(l, p.layers[l], c.batch, xv(l), xv(l + 1)).ok());
      ASSERT_TRUE(mc->head_forward(p.final_norm, p.lm_head, c.batch, xv(L)).ok());
      ASSERT_TRUE(
          mc->head_backward(p.final_norm, p.lm_head, g.final_norm, g.lm_head, c.batch, xv(L)).ok());
      // Layers 0 and 1 (workspaces 0 and 1) forwarded last: layer 0 backward first.
      ASSERT_TRUE(mc->layer_forward(0, p.layers[0], c.batch, xv(0), xv(L + 1)).ok());
      ASSERT_TRUE(mc->layer_forward(1, p.layers[1], c.batch, xv(1), xv(L + 1)).ok());
      ASSERT_TRUE(mc->layer_backward(0, p.layers[0], g.layers[0], c.batch, xv(0)).ok());
      ASSERT_TRUE(mc->layer_forward(1, p.layers[1], c.batch, xv(1), xv(L + 1)).ok());
      ASSERT_TRUE(mc->layer_backward(1, p.layers[1], g.layers[1], c.batch, xv(1)).ok());
      ASSERT_TRUE(mc->layer_backward(1, p.layers[1], g.layers[1], c.batch, xv(1)).ok());
      runs[reuse ? 1 : 0].grads = grads_of(**grads);
      runs[reuse ? 1 : 0].converts = mc->gemm_input_converts();
    }
    expect_same(runs[1], runs[0], "stale-copy order");
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
