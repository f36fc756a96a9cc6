// SPDX-License-Identifier: Apache-2.0
// ModelCompute's attention-backward workspace and its bf16 attention buffers, on the host: what
// the CUDA path does, checked with a CPU backend that behaves like CUDA where it matters here
// (CudaLikeCpu below: attention only in bf16, and an attention backward that asks for a
// workspace of 8 T H D bytes, as the CUDA backend does, and scribbles over all of it).
//   - planned_bytes() counts the workspace once (kOn minus kOff = the backend's bytes for
//     max_tokens, within the arena's slot alignment, with the scratch overlay off: with it on the
//     workspace shares bytes with the MLP backward's, model_compute_overlay_test.cpp), equals
//     what create() allocates, and is 0 on the plain CPU backend and for a geometry without
//     grouped heads;
//   - every attention backward gets a workspace of exactly the bytes asked for at its T (so a
//     smaller batch than planned gets the same split), none when off;
//   - the gradients are the same bits with and without it (nothing else lives in it), on the
//     whole-model path and on train/stream's per-layer path;
//   - a layer's backward right after its own forward reuses the forward's bf16 q/k/v/out
//     (one f32 -> bf16 cast, dO) and otherwise recasts them (five), with the same bits.
// The kernels' own use of the workspace (the CUDA dK/dV split) is tested in
// tests/gpu/kernels_attention_test.cpp; the whole CUDA path in tests/gpu/model_gpu_test.cpp.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <utility>

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

// The CPU backend, but attention sees and produces bf16 (values widened to f32 for the CPU's
// attention, results rounded back; Bf16AttentionBackend) and its backward asks for a CUDA-sized
// workspace, and scribbles over all of it.
class CudaLikeCpu final : public testing::Bf16AttentionBackend {
 public:
  std::string_view name() const override { return "cpu+cuda-like-attention"; }
  // As CUDA: the dK/dV partials (8 T H D bytes) only for grouped heads; with atomic_dq also an
  // accumulator (4 T H D bytes) for any H, G (FERRY_ATTN_BWD_DQ=atomic).
  std::size_t workspace_bytes(const kernels::AttentionBackwardArgs& a) const override {
    if (a.q.ndim != 3 || a.k.ndim != 3) return 0;
    const std::int64_t thd = a.q.shape[0] * a.q.shape[1] * a.q.shape[2];
    const bool grouped = a.k.shape[1] != a.q.shape[1];
    return static_cast<std::size_t>((grouped ? 8 * thd : 0) + (atomic_dq ? 4 * thd : 0));
  }
  bool atomic_dq = false;
  Status attention_backward(const kernels::AttentionBackwardArgs& a, mem::Stream& s) override {
    ++backward_calls;
    last_workspace_bytes = a.workspace.empty_view() ? 0 : a.workspace.bytes();
    last_wanted_bytes = workspace_bytes(a);
    // A kernel may leave anything in its workspace: whatever else shared those bytes would show.
    if (!a.workspace.empty_view()) std::memset(a.workspace.data, 0xA5, a.workspace.bytes());
    return Bf16AttentionBackend::attention_backward(a, s);
  }

  int backward_calls = 0;
  std::size_t last_workspace_bytes = 0, last_wanted_bytes = 0;
};

// Whole-model forward + backward; the gradients.
testing::Grads whole_model(Case& c, Backend& be, AttnBwdWorkspace ws, std::int64_t max_tokens) {
  auto mc =
      ModelCompute::create(c.m->geometry, max_tokens, be, -1, nullptr, GemmPrecision::kF32, ws);
  EXPECT_TRUE(mc.ok()) << mc.status().to_string();
  auto grads = GradStorage::create(*c.m);
  EXPECT_TRUE(grads.ok());
  if (!mc.ok() || !grads.ok()) return {};
  testing::forward_backward(**mc, c, (*grads)->grads);
  return testing::grads_of(**grads);
}

TEST(ModelComputeAttnWorkspace, PlannedOnceAndCountedInPlannedBytes) {
  // The workspace's own bytes: without the overlay, where it would share them.
  const testing::ScopedEnv no_overlay("FERRY_SCRATCH_OVERLAY", "0");
  Case c = load_case("qwen3");  // 4 heads over 2 kv heads of 32
  ASSERT_TRUE(c.m != nullptr);
  const DecoderGeometry& geo = c.m->geometry;
  ASSERT_GT(geo.heads, geo.kv_heads);
  CudaLikeCpu be;
  for (int work : {1, geo.layers}) {
    for (std::int64_t T : {std::int64_t{1}, std::int64_t{37}, std::int64_t{200}}) {
      auto on =
          ModelCompute::planned_bytes(geo, T, be, work, GemmPrecision::kF32, AttnBwdWorkspace::kOn);
      auto off = ModelCompute::planned_bytes(geo, T, be, work, GemmPrecision::kF32,
                                             AttnBwdWorkspace::kOff);
      ASSERT_TRUE(on.ok() && off.ok());
      const std::size_t ws = static_cast<std::size_t>(8 * T * geo.heads * geo.head_dim);
      // Once, whatever the number of layer workspaces; the arena aligns slots to 256 bytes.
      EXPECT_GE(*on - *off, ws) << "work " << work << " T " << T;
      EXPECT_LT(*on - *off, ws + 256) << "work " << work << " T " << T;
      for (auto [mode, planned] :
           {std::pair{AttnBwdWorkspace::kOn, *on}, std::pair{AttnBwdWorkspace::kOff, *off}}) {
        auto mc = ModelCompute::create(geo, T, be, work, nullptr, GemmPrecision::kF32, mode);
        ASSERT_TRUE(mc.ok()) << mc.status().to_string();
        EXPECT_EQ((*mc)->total_bytes(), planned);
        EXPECT_EQ((*mc)->attention_workspace_bytes(), mode == AttnBwdWorkspace::kOn ? ws : 0u);
        EXPECT_TRUE((*mc)->attention_in_bf16());
      }
      // kDefault is the process default (on unless FERRY_ATTN_BWD_WORKSPACE=0).
      auto dflt = ModelCompute::planned_bytes(geo, T, be, work);
      ASSERT_TRUE(dflt.ok());
      EXPECT_EQ(*dflt, attn_bwd_workspace_default() ? *on : *off);
    }
  }
  // The CPU backend asks for none: no bytes either way.
  for (Backend* host : {&kernels::cpu_backend(), &kernels::reference_backend()}) {
    auto on =
        ModelCompute::planned_bytes(geo, 50, *host, 1, GemmPrecision::kF32, AttnBwdWorkspace::kOn);
    auto off =
        ModelCompute::planned_bytes(geo, 50, *host, 1, GemmPrecision::kF32, AttnBwdWorkspace::kOff);
    ASSERT_TRUE(on.ok() && off.ok());
    EXPECT_EQ(*on, *off) << host->name();
  }
  // Without grouped heads there is nothing to split: none planned, unless the backend asks for
  // some anyway (CUDA's atomic dQ accumulator), which is then planned as for grouped heads.
  DecoderGeometry mha = geo;
  mha.kv_heads = mha.heads;
  auto on = ModelCompute::planned_bytes(mha, 50, be, 1, GemmPrecision::kF32, AttnBwdWorkspace::kOn);
  auto off =
      ModelCompute::planned_bytes(mha, 50, be, 1, GemmPrecision::kF32, AttnBwdWorkspace::kOff);
  ASSERT_TRUE(on.ok() && off.ok());
  EXPECT_EQ(*on, *off);
  CudaLikeCpu atomic;
  atomic.atomic_dq = true;
  auto on_atomic =
      ModelCompute::planned_bytes(mha, 50, atomic, 1, GemmPrecision::kF32, AttnBwdWorkspace::kOn);
  auto off_atomic =
      ModelCompute::planned_bytes(mha, 50, atomic, 1, GemmPrecision::kF32, AttnBwdWorkspace::kOff);
  ASSERT_TRUE(on_atomic.ok() && off_atomic.ok());
  const std::size_t asked = static_cast<std::size_t>(4 * 50 * mha.heads * mha.head_dim);
  EXPECT_GE(*on_atomic - *off_atomic, asked);
  EXPECT_LT(*on_atomic - *off_atomic, asked + 256);
}

TEST(ModelComputeAttnWorkspace, SameBitsWithAndWithoutAndSizedForTheCall) {
  for (const char* arch : {"qwen2", "qwen3_moe"}) {
    SCOPED_TRACE(arch);
    Case c = load_case(arch);
    ASSERT_TRUE(c.m != nullptr);
    const DecoderGeometry& geo = c.m->geometry;
    CudaLikeCpu be;
    const auto off = whole_model(c, be, AttnBwdWorkspace::kOff, c.T);
    EXPECT_EQ(be.last_workspace_bytes, 0u);
    EXPECT_EQ(be.backward_calls, geo.layers);
    // Planned for more tokens than the batch has: the call gets exactly what it asks for.
    const auto on = whole_model(c, be, AttnBwdWorkspace::kOn, c.T + 13);
    EXPECT_EQ(be.backward_calls, 2 * geo.layers);
    EXPECT_EQ(be.last_workspace_bytes, be.last_wanted_bytes);
    EXPECT_EQ(be.last_workspace_bytes,
              static_cast<std::size_t>(8 * c.T * geo.heads * geo.head_dim));
    testing::expect_same_grads(on, off, arch);
  }
}

// train/stream's order (each layer recomputed right before its backward) reuses the forward's
// bf16 q/k/v/out; the whole-model order reuses them for its last layer only. Same bits.
TEST(ModelComputeAttnWorkspace, BackwardReusesTheForwardsBf16Copies) {
  Case c = load_case("qwen2");
  ASSERT_TRUE(c.m != nullptr);
  const DecoderGeometry& geo = c.m->geometry;
  const int L = geo.layers;
  ASSERT_GE(L, 2);
  CudaLikeCpu be;

  // Whole model: 4 recasts per layer but the last, one dO cast per layer.
  auto whole = ModelCompute::create(geo, c.T, be, -1);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  auto gw = GradStorage::create(*c.m);
  ASSERT_TRUE(gw.ok());
  ASSERT_TRUE((*whole)->forward(c.m->params, c.batch).ok());
  be.casts_down = 0;
  ASSERT_TRUE((*whole)->backward(c.m->params, c.batch, (*gw)->grads).ok());
  EXPECT_EQ(be.casts_down, L + 4 * (L - 1));

  // Per layer, one workspace, each layer recomputed before its backward: one cast per layer.
  auto pl = ModelCompute::create(geo, c.T, be, 1);
  ASSERT_TRUE(pl.ok()) << pl.status().to_string();
  auto gp = GradStorage::create(*c.m);
  ASSERT_TRUE(gp.ok());
  testing::PerLayerRun run(**pl, c, (*gp)->grads);
  ASSERT_TRUE(run.forward());
  for (int l = L - 1; l >= 0; --l) {
    ASSERT_TRUE(run.reforward(l));
    be.casts_down = 0;
    ASSERT_TRUE(run.backward(l));
    EXPECT_EQ(be.casts_down, 1) << "layer " << l;
  }
  ASSERT_TRUE(run.embed_backward());
  // Two layer workspaces, both layers forwarded, then layer 0's backward: the bf16 buffers hold
  // layer 1's copies, so layer 0's are recast (four, and dO).
  auto two = ModelCompute::create(geo, c.T, be, 2);
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  auto scratch = GradStorage::create(*c.m);
  ASSERT_TRUE(scratch.ok());
  testing::PerLayerRun run_two(**two, c, (*scratch)->grads);
  ASSERT_TRUE(run_two.forward());
  be.casts_down = 0;
  ASSERT_TRUE(run_two.backward(0));
  EXPECT_EQ(be.casts_down, 5);

  const auto a = testing::grads_of(**gw), b = testing::grads_of(**gp);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0)
        << (*gw)->named[i].first;
  }
}

}  // namespace
}  // namespace ferry::model
