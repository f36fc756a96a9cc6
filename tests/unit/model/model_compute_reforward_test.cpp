// SPDX-License-Identifier: Apache-2.0
// ModelCompute::layer_forward_internals, the re-forward train/stream runs right before the
// backward of a layer whose internals were not kept, on the host:
//   - with it, the per-layer order (forward every layer, the loss, then from the top the
//     internals-only re-forward and the backward) gives the whole-model path's loss and gradients
//     bit for bit, as the full layer_forward re-forward does: dense and MoE fixtures, f32 and bf16
//     GEMMs, GEMM input reuse on and off, attention in f32 and in bf16 as on CUDA;
//   - what it skips, counted at the backend: a dense layer's re-forward issues exactly one GEMM
//     fewer than the full forward, that GEMM being the down projection (out [T, hidden], inner
//     dimension mlp_width), and one residual add fewer; an MoE layer's issues the same GEMMs (the
//     experts' down outputs are read by the router's gradient) and no combine and no add;
//   - internals_forwards() counts the calls; a malformed input is refused and not counted.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/model_binding.h"
#include "unit/kernels/forwarding_backend.h"
#include "unit/model/bf16_attention_backend.h"
#include "unit/model/model_compute_test_util.h"

namespace ferry::model {
namespace {

using kernels::Backend;
using testing::Bf16AttentionBackend;
using testing::Case;
using testing::load_case;

using Pass = testing::LossAndGrads;

// The executor's order with every layer re-forwarded before its backward, by the internals-only
// call (internals = true) or the full layer_forward.
Pass per_layer(Case& c, Backend& be, GemmPrecision precision, bool reuse, bool internals) {
  Pass r;
  auto mc = ModelCompute::create(c.m->geometry, c.T, be, 1, nullptr, precision);
  auto grads = GradStorage::create(*c.m);
  EXPECT_TRUE(mc.ok() && grads.ok());
  if (!mc.ok() || !grads.ok()) return r;
  ModelCompute& m = **mc;
  m.set_gemm_input_reuse(reuse);
  testing::PerLayerRun run(m, c, (*grads)->grads);
  run.forward();
  r.loss = run.loss();
  const int L = c.m->geometry.layers;
  for (int l = L - 1; l >= 0; --l) {
    if (internals) {
      run.reforward(l);
    } else {
      run.reforward_full(l);
    }
    run.backward(l);
  }
  run.embed_backward();
  EXPECT_EQ(m.internals_forwards(), internals ? static_cast<std::uint64_t>(L) : 0u);
  r.grads = testing::grads_of(**grads);
  return r;
}

TEST(ModelComputeReforward, InternalsOnlyGivesTheWholeModelsBits) {
  Bf16AttentionBackend bf16_attention;
  for (Backend* be : {&kernels::cpu_backend(), static_cast<Backend*>(&bf16_attention)}) {
    for (const char* arch : {"qwen2", "qwen3", "qwen3_moe", "olmoe"}) {
      Case c = load_case(arch);
      ASSERT_TRUE(c.m != nullptr);
      for (GemmPrecision prec : {GemmPrecision::kF32, GemmPrecision::kBf16}) {
        const Pass whole = testing::whole_model_pass(c, *be, prec);
        for (bool reuse : {true, false}) {
          const std::string what = std::string(arch) + " on " + std::string(be->name()) + ", " +
                                   std::string(to_string(prec)) + " GEMMs, reuse " +
                                   (reuse ? "on" : "off");
          SCOPED_TRACE(what);
          testing::expect_same(per_layer(c, *be, prec, reuse, true), whole, what + ", internals");
          testing::expect_same(per_layer(c, *be, prec, reuse, false), whole, what + ", full");
        }
      }
    }
  }
}

// The CPU backend, recording the GEMMs (output columns, inner dimension), adds and combines.
class CallRecording final : public testing::ForwardingBackend {
 public:
  struct Gemm {
    std::int64_t n = 0, k = 0;
    bool operator==(const Gemm&) const = default;
  };
  Status gemm(const kernels::GemmArgs& a, mem::Stream& s) override {
    gemms.push_back({a.out.dim(1), a.trans_a ? a.a.dim(0) : a.a.dim(1)});
    return ForwardingBackend::gemm(a, s);
  }
  Status add(const kernels::AddArgs& a, mem::Stream& s) override {
    ++adds;
    return ForwardingBackend::add(a, s);
  }
  Status moe_combine(const kernels::MoeCombineArgs& a, mem::Stream& s) override {
    ++combines;
    return ForwardingBackend::moe_combine(a, s);
  }
  void clear() {
    gemms.clear();
    adds = combines = 0;
  }
  std::vector<Gemm> gemms;
  int adds = 0, combines = 0;
};

// Removes the first occurrence of g from v; false when there is none.
bool remove_one(std::vector<CallRecording::Gemm>& v, const CallRecording::Gemm& g) {
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (*it == g) {
      v.erase(it);
      return true;
    }
  }
  return false;
}

// qwen3_moe: MoE layers 0 and 2 around dense layer 1; qwen3: all dense.
TEST(ModelComputeReforward, SkipsTheDownProjectionAndTheResidualAddOnly) {
  for (const char* arch : {"qwen3", "qwen3_moe"}) {
    Case c = load_case(arch);
    ASSERT_TRUE(c.m != nullptr);
    const DecoderGeometry& geo = c.m->geometry;
    for (GemmPrecision prec : {GemmPrecision::kF32, GemmPrecision::kBf16}) {
      CallRecording be;
      auto mc = ModelCompute::create(geo, c.T, be, 1, nullptr, prec);
      auto grads = GradStorage::create(*c.m);
      ASSERT_TRUE(mc.ok() && grads.ok());
      testing::PerLayerRun run(**mc, c, (*grads)->grads);
      ASSERT_TRUE(run.forward());
      for (int l = 0; l < geo.layers; ++l) {
        const bool moe = geo.layer_is_moe[static_cast<std::size_t>(l)];
        SCOPED_TRACE(std::string(arch) + " layer " + std::to_string(l) + (moe ? " (MoE), " : ", ") +
                     std::string(to_string(prec)));
        be.clear();
        ASSERT_TRUE(run.reforward_full(l));
        std::vector<CallRecording::Gemm> full = be.gemms;
        const int full_adds = be.adds, full_combines = be.combines;
        be.clear();
        ASSERT_TRUE(run.reforward(l));
        if (moe) {
          EXPECT_EQ(be.gemms, full);
          EXPECT_EQ(full_combines, 1);
          EXPECT_EQ(be.combines, 0);
        } else {
          ASSERT_EQ(be.gemms.size() + 1, full.size());
          // The one GEMM skipped is the down projection: [T, mlp_width] x [hidden, mlp_width]^T.
          for (const CallRecording::Gemm& g : be.gemms) {
            EXPECT_TRUE(remove_one(full, g)) << "n " << g.n << " k " << g.k;
          }
          ASSERT_EQ(full.size(), 1u);
          EXPECT_EQ(full[0].n, geo.hidden);
          EXPECT_EQ(full[0].k, geo.mlp_width);
        }
        EXPECT_EQ(be.adds + 1, full_adds);
      }
    }
  }
}

TEST(ModelComputeReforward, CountsCallsAndRefusesAMalformedInput) {
  Case c = load_case("qwen3");
  ASSERT_TRUE(c.m != nullptr);
  auto mc = ModelCompute::create(c.m->geometry, c.T, kernels::cpu_backend(), 1);
  ASSERT_TRUE(mc.ok()) << mc.status().to_string();
  std::vector<float> x(static_cast<std::size_t>(c.T * c.m->geometry.hidden), 0.5f);
  const auto view = [&](std::int64_t rows) {
    return ConstTensorView::contiguous(x.data(), DType::kF32, Device::kCpu,
                                       {rows, std::int64_t(c.m->geometry.hidden)});
  };
  ASSERT_TRUE((*mc)->layer_forward_internals(0, c.m->params.layers[0], c.batch, view(c.T)).ok());
  EXPECT_EQ((*mc)->internals_forwards(), 1u);
  const Status short_input =
      (*mc)->layer_forward_internals(0, c.m->params.layers[0], c.batch, view(c.T - 1));
  EXPECT_EQ(short_input.code(), StatusCode::kInvalidArgument) << short_input.to_string();
  const Status bad_layer = (*mc)->layer_forward_internals(
      c.m->geometry.layers, c.m->params.layers[0], c.batch, view(c.T));
  EXPECT_EQ(bad_layer.code(), StatusCode::kInvalidArgument) << bad_layer.to_string();
  EXPECT_EQ((*mc)->internals_forwards(), 1u);
}

}  // namespace
}  // namespace ferry::model
