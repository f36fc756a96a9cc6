// SPDX-License-Identifier: Apache-2.0
// ModelCompute's scratch overlay (scratch_overlay_default(), plan_buffers in model_compute.cpp):
// the attention backward's, the dense MLP backward's, the MoE backward's and the loss head's
// buffers share one region. Checked against the same ModelCompute with the overlay off
// (FERRY_SCRATCH_OVERLAY=0, every buffer its own slot), the twin:
//   - planned_bytes() is smaller with it, by at least the smaller sets, and equals what create()
//     allocates in both modes;
//   - the loss and every gradient are the same bits with and without it, on the whole-model path
//     and in train/stream's per-layer order (embed, forwards, head forward + backward, then each
//     layer re-forwarded and back-propagated), for every fixture architecture, in f32 and bf16
//     GEMM precision, on the CPU backend and on a CPU backend that behaves like CUDA (bf16-only
//     attention whose backward asks for a workspace and scribbles over all of it). A buffer of
//     one set read after another set wrote over it would change bits here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "kernels/backend.h"
#include "model/model_binding.h"
#include "model_fixtures.h"
#include "scoped_env.h"
#include "unit/model/bf16_attention_backend.h"
#include "unit/model/model_compute_test_util.h"

namespace ferry::model {
namespace {

using kernels::Backend;
using testing::Case;
using testing::load_case;

constexpr const char* kArchs[] = {"llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "olmoe"};

// bf16-only attention with a CUDA-sized backward workspace (8 T H D bytes for grouped heads),
// filled with a pattern by every backward call: what the CUDA kernels may leave there.
class ScribblingBf16Attention final : public testing::Bf16AttentionBackend {
 public:
  std::string_view name() const override { return "cpu+scribbling-bf16-attention"; }
  std::size_t workspace_bytes(const kernels::AttentionBackwardArgs& a) const override {
    if (a.q.ndim != 3 || a.k.ndim != 3 || a.k.shape[1] == a.q.shape[1]) return 0;
    return static_cast<std::size_t>(8 * a.q.shape[0] * a.q.shape[1] * a.q.shape[2]);
  }
  Status attention_backward(const kernels::AttentionBackwardArgs& a, mem::Stream& s) override {
    if (!a.workspace.empty_view()) std::memset(a.workspace.data, 0xA5, a.workspace.bytes());
    return Bf16AttentionBackend::attention_backward(a, s);
  }
};

using Pass = testing::LossAndGrads;

// train/stream's order on one layer workspace.
Pass per_layer(Case& c, Backend& be, GemmPrecision prec) {
  Pass r;
  auto mc = ModelCompute::create(c.m->geometry, c.T, be, 1, nullptr, prec);
  auto g = GradStorage::create(*c.m);
  EXPECT_TRUE(mc.ok() && g.ok());
  if (!mc.ok() || !g.ok()) return r;
  testing::PerLayerRun run(**mc, c, (*g)->grads);
  bool ok = run.forward();
  for (int l = c.m->geometry.layers - 1; ok && l >= 0; --l)
    ok = run.reforward(l) && run.backward(l);
  ok = ok && run.embed_backward();
  EXPECT_TRUE(ok);
  r.loss = run.loss();
  r.grads = testing::grads_of(**g);
  return r;
}

TEST(ModelComputeOverlay, SmallerPlanThatCreateAllocates) {
  ScribblingBf16Attention cuda_like;
  for (const char* arch : kArchs) {
    Case c = load_case(arch);
    ASSERT_TRUE(c.m != nullptr) << arch;
    const DecoderGeometry& geo = c.m->geometry;
    for (Backend* be : {&kernels::cpu_backend(), static_cast<Backend*>(&cuda_like)}) {
      for (GemmPrecision prec : {GemmPrecision::kF32, GemmPrecision::kBf16}) {
        for (int work : {1, geo.layers}) {
          for (std::int64_t T : {std::int64_t{1}, std::int64_t{64}}) {
            const std::string what = std::string(arch) + " " + std::string(be->name()) +
                                     (prec == GemmPrecision::kBf16 ? " bf16" : " f32") + " work " +
                                     std::to_string(work) + " T " + std::to_string(T);
            std::size_t bytes[2] = {0, 0};  // [overlay on, off]
            for (int off = 0; off < 2; ++off) {
              const testing::ScopedEnv env("FERRY_SCRATCH_OVERLAY", off ? "0" : nullptr);
              EXPECT_EQ(scratch_overlay_default(), off == 0);
              auto planned = ModelCompute::planned_bytes(geo, T, *be, work, prec);
              ASSERT_TRUE(planned.ok()) << what << ": " << planned.status().to_string();
              auto mc = ModelCompute::create(geo, T, *be, work, nullptr, prec);
              ASSERT_TRUE(mc.ok()) << what << ": " << mc.status().to_string();
              EXPECT_EQ((*mc)->total_bytes(), *planned) << what;
              bytes[off] = *planned;
            }
            // The overlay holds the largest set, so at least the smaller of the attention
            // backward's f32 set (d_attn, dq, dq_pre; dk, dv, dk_pre) and the FFN backward's
            // (dense: d_act, d_gate, d_up; MoE: d_eout .. d_router_logits) is saved, less the
            // overlay's internal 256-byte alignment (at most 255 bytes per buffer, < 16 of them).
            const std::int64_t HD = std::int64_t{geo.heads} * geo.head_dim,
                               GD = std::int64_t{geo.kv_heads} * geo.head_dim;
            const std::int64_t C = geo.hidden, F = geo.mlp_width, Fe = geo.expert_width,
                               E = geo.experts, K = geo.top_k;
            bool dense = false;
            for (bool moe : geo.layer_is_moe) dense = dense || !moe;
            const std::int64_t attn_set = 4 * T * (3 * HD + 3 * GD);
            const std::int64_t ffn_set = std::max(
                dense ? 12 * T * F : 0, E > 0 ? 4 * T * (2 * K * C + 3 * K * Fe + K + E) : 0);
            const auto saved = static_cast<std::int64_t>(bytes[1]) - std::int64_t(bytes[0]);
            EXPECT_GT(saved, 0) << what;
            EXPECT_GE(saved + 16 * 256, std::min(attn_set, ffn_set)) << what;
          }
        }
      }
    }
  }
}

TEST(ModelComputeOverlay, SameBitsWithAndWithout) {
  ScribblingBf16Attention cuda_like;
  for (const char* arch : kArchs) {
    Case c = load_case(arch);
    ASSERT_TRUE(c.m != nullptr) << arch;
    for (Backend* be : {&kernels::cpu_backend(), static_cast<Backend*>(&cuda_like)}) {
      for (GemmPrecision prec : {GemmPrecision::kF32, GemmPrecision::kBf16}) {
        const std::string what = std::string(arch) + " " + std::string(be->name()) +
                                 (prec == GemmPrecision::kBf16 ? " bf16" : " f32");
        Pass on_whole, on_layer, off_whole, off_layer;
        {
          const testing::ScopedEnv env("FERRY_SCRATCH_OVERLAY", nullptr);
          on_whole = testing::whole_model_pass(c, *be, prec);
          on_layer = per_layer(c, *be, prec);
        }
        {
          const testing::ScopedEnv env("FERRY_SCRATCH_OVERLAY", "0");
          off_whole = testing::whole_model_pass(c, *be, prec);
          off_layer = per_layer(c, *be, prec);
        }
        ASSERT_FALSE(on_whole.grads.empty()) << what;
        testing::expect_same(on_whole, off_whole, what + " whole model");
        testing::expect_same(on_layer, off_layer, what + " per layer");
      }
    }
  }
}

}  // namespace
}  // namespace ferry::model
