// SPDX-License-Identifier: Apache-2.0
// ModelCompute's attention-backward workspace and its bf16 attention buffers, on the host: what
// the CUDA path does, checked with a CPU backend that behaves like CUDA where it matters here
// (CudaLikeCpu below: attention only in bf16, and an attention backward that asks for a
// workspace of 8 T H D bytes, as the CUDA backend does, and scribbles over all of it).
//   - planned_bytes() counts the workspace once (kOn minus kOff = the backend's bytes for
//     max_tokens, within the arena's slot alignment), equals what create() allocates, and is 0
//     on the plain CPU backend and for a geometry without grouped heads;
//   - every attention backward gets a workspace of exactly the bytes asked for at its T (so a
//     smaller batch than planned gets the same split), none when off;
//   - the gradients are the same bits with and without it (nothing else lives in it), on the
//     whole-model path and on train/stream's per-layer path;
//   - a layer's backward right after its own forward reuses the forward's bf16 q/k/v/out
//     (one f32 -> bf16 cast, dO) and otherwise recasts them (five), with the same bits.
// The kernels' own use of the workspace (the CUDA dK/dV split) is tested in
// tests/gpu/kernels_attention_test.cpp; the whole CUDA path in tests/gpu/model_gpu_test.cpp.
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

// The CPU backend, but attention sees and produces bf16 (values widened to f32 for the CPU's
// attention, results rounded back) and its backward asks for a CUDA-sized workspace.
class CudaLikeCpu final : public testing::ForwardingBackend {
 public:
  std::string_view name() const override { return "cpu+cuda-like-attention"; }
  bool supports(kernels::OpKind op, DType dt) const override {
    if (op == kernels::OpKind::kAttention || op == kernels::OpKind::kAttentionBackward)
      return dt == DType::kBF16;
    return cpu().supports(op, dt);
  }
  std::size_t workspace_bytes(const kernels::AttentionBackwardArgs& a) const override {
    if (a.q.ndim != 3) return 0;
    return static_cast<std::size_t>(8 * a.q.shape[0] * a.q.shape[1] * a.q.shape[2]);
  }
  Status convert(const kernels::ConvertArgs& a, mem::Stream& s) override {
    if (a.in.dtype == DType::kF32 && a.out.dtype == DType::kBF16) ++casts_down;
    return cpu().convert(a, s);
  }

  Status attention(const kernels::AttentionArgs& a, mem::Stream& s) override {
    std::vector<float> q = widened(a.q), k = widened(a.k), v = widened(a.v), out(numel(a.out));
    FERRY_TRY(cpu().attention({.out = f32(out, a.out),
                               .lse = a.lse,
                               .q = f32(q, a.q),
                               .k = f32(k, a.k),
                               .v = f32(v, a.v),
                               .cu_seqlens = a.cu_seqlens,
                               .scale = a.scale,
                               .causal = a.causal},
                              s));
    return narrow_into(out, a.out, s);
  }
  Status attention_backward(const kernels::AttentionBackwardArgs& a, mem::Stream& s) override {
    ++backward_calls;
    last_workspace_bytes = a.workspace.empty_view() ? 0 : a.workspace.bytes();
    last_wanted_bytes = workspace_bytes(a);
    // A kernel may leave anything in its workspace: whatever else shared those bytes would show.
    if (!a.workspace.empty_view()) std::memset(a.workspace.data, 0xA5, a.workspace.bytes());
    std::vector<float> q = widened(a.q), k = widened(a.k), v = widened(a.v), out = widened(a.out),
                       dout = widened(a.d_out), dq(numel(a.d_q)), dk(numel(a.d_k)),
                       dv(numel(a.d_v));
    FERRY_TRY(cpu().attention_backward({.d_q = f32(dq, a.d_q),
                                        .d_k = f32(dk, a.d_k),
                                        .d_v = f32(dv, a.d_v),
                                        .d_out = f32(dout, a.d_out),
                                        .q = f32(q, a.q),
                                        .k = f32(k, a.k),
                                        .v = f32(v, a.v),
                                        .out = f32(out, a.out),
                                        .lse = a.lse,
                                        .cu_seqlens = a.cu_seqlens,
                                        .scale = a.scale,
                                        .causal = a.causal},
                                       s));
    FERRY_TRY(narrow_into(dq, a.d_q, s));
    FERRY_TRY(narrow_into(dk, a.d_k, s));
    return narrow_into(dv, a.d_v, s);
  }

  int casts_down = 0;  // f32 -> bf16 converts
  int backward_calls = 0;
  std::size_t last_workspace_bytes = 0, last_wanted_bytes = 0;

 private:
  static Backend& cpu() { return kernels::cpu_backend(); }
  static std::size_t numel(const ConstTensorView& v) { return static_cast<std::size_t>(v.numel()); }
  // buf viewed with like's (contiguous) shape, in f32.
  static TensorView f32(std::vector<float>& buf, const ConstTensorView& like) {
    TensorView t;
    t.data = buf.data();
    t.dtype = DType::kF32;
    t.device = Device::kCpu;
    t.ndim = like.ndim;
    t.shape = like.shape;
    t.stride = like.stride;
    return t;
  }
  static std::vector<float> widened(const ConstTensorView& v) {
    std::vector<float> out(numel(v));
    EXPECT_TRUE(convert_elements(v.data, v.dtype, out.data(), DType::kF32, out.size()));
    return out;
  }
  static Status narrow_into(std::vector<float>& f, const TensorView& out, mem::Stream& s) {
    return cpu().convert({.out = out, .in = f32(f, out)}, s);
  }
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

std::vector<std::vector<float>> grads_of(const GradStorage& g) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, v] : g.named) {
    const float* p = v.as<float>();
    out.emplace_back(p, p + v.numel());
  }
  return out;
}

// Whole-model forward + backward; the gradients.
std::vector<std::vector<float>> whole_model(Case& c, Backend& be, AttnBwdWorkspace ws,
                                            std::int64_t max_tokens) {
  auto mc =
      ModelCompute::create(c.m->geometry, max_tokens, be, -1, nullptr, GemmPrecision::kF32, ws);
  EXPECT_TRUE(mc.ok()) << mc.status().to_string();
  auto grads = GradStorage::create(*c.m);
  EXPECT_TRUE(grads.ok());
  if (!mc.ok() || !grads.ok()) return {};
  auto fwd = (*mc)->forward(c.m->params, c.batch);
  EXPECT_TRUE(fwd.ok()) << fwd.status().to_string();
  const Status s = (*mc)->backward(c.m->params, c.batch, (*grads)->grads);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return grads_of(**grads);
}

TEST(ModelComputeAttnWorkspace, PlannedOnceAndCountedInPlannedBytes) {
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
  // Without grouped heads there is nothing to split: none planned.
  DecoderGeometry mha = geo;
  mha.kv_heads = mha.heads;
  auto on = ModelCompute::planned_bytes(mha, 50, be, 1, GemmPrecision::kF32, AttnBwdWorkspace::kOn);
  auto off =
      ModelCompute::planned_bytes(mha, 50, be, 1, GemmPrecision::kF32, AttnBwdWorkspace::kOff);
  ASSERT_TRUE(on.ok() && off.ok());
  EXPECT_EQ(*on, *off);
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
    ASSERT_EQ(on.size(), off.size());
    for (std::size_t i = 0; i < on.size(); ++i) {
      ASSERT_EQ(on[i].size(), off[i].size());
      EXPECT_EQ(std::memcmp(on[i].data(), off[i].data(), on[i].size() * sizeof(float)), 0)
          << "gradient " << i;
    }
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
  const std::int64_t C = geo.hidden;
  std::vector<std::vector<float>> x(static_cast<std::size_t>(L + 2),
                                    std::vector<float>(static_cast<std::size_t>(c.T * C)));
  auto xv = [&](int i) {
    return TensorView::contiguous(x[static_cast<std::size_t>(i)].data(), DType::kF32, Device::kCpu,
                                  {c.T, C});
  };
  ModelCompute& m = **pl;
  ASSERT_TRUE(m.embed(c.m->params.embed, c.batch, xv(0)).ok());
  for (int l = 0; l < L; ++l)
    ASSERT_TRUE(m.layer_forward(l, c.m->params.layers[l], c.batch, xv(l), xv(l + 1)).ok());
  auto head = m.head_forward(c.m->params.final_norm, c.m->params.lm_head, c.batch, xv(L));
  ASSERT_TRUE(head.ok()) << head.status().to_string();
  ASSERT_TRUE(m.head_backward(c.m->params.final_norm, c.m->params.lm_head, (*gp)->grads.final_norm,
                              (*gp)->grads.lm_head, c.batch, xv(L))
                  .ok());
  for (int l = L - 1; l >= 0; --l) {
    ASSERT_TRUE(m.layer_forward(l, c.m->params.layers[l], c.batch, xv(l), xv(L + 1)).ok());
    be.casts_down = 0;
    ASSERT_TRUE(
        m.layer_backward(l, c.m->params.layers[l], (*gp)->grads.layers[l], c.batch, xv(l)).ok());
    EXPECT_EQ(be.casts_down, 1) << "layer " << l;
  }
  // Two layer workspaces, both layers forwarded, then layer 0's backward: the bf16 buffers hold
  // layer 1's copies, so layer 0's are recast (four, and dO).
  auto two = ModelCompute::create(geo, c.T, be, 2);
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  auto scratch = GradStorage::create(*c.m);
  ASSERT_TRUE(scratch.ok());
  for (int l = 0; l < 2; ++l)
    ASSERT_TRUE((*two)->layer_forward(l, c.m->params.layers[l], c.batch, xv(l), xv(L + 1)).ok());
  ASSERT_TRUE(
      (*two)->head_forward(c.m->params.final_norm, c.m->params.lm_head, c.batch, xv(L)).ok());
  ASSERT_TRUE((*two)
                  ->head_backward(c.m->params.final_norm, c.m->params.lm_head,
                                  (*scratch)->grads.final_norm, (*scratch)->grads.lm_head, c.batch,
                                  xv(L))
                  .ok());
  be.casts_down = 0;
  ASSERT_TRUE(
      (*two)
          ->layer_backward(0, c.m->params.layers[0], (*scratch)->grads.layers[0], c.batch, xv(0))
          .ok());
  EXPECT_EQ(be.casts_down, 5);
  ASSERT_TRUE(m.embed_backward((*gp)->grads.embed, c.batch).ok());

  const auto a = grads_of(**gw), b = grads_of(**gp);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0)
        << (*gw)->named[i].first;
  }
}

}  // namespace
}  // namespace ferry::model
