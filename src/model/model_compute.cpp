// SPDX-License-Identifier: Apache-2.0
// ModelCompute: buffer planning and the forward pass. The backward pass is in
// model_compute_backward.cpp. Read model_compute.h first.
#include "model/model_compute.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

#include "mem/arena.h"
#include "mem/budget.h"
#include "mem/tier.h"
#include "mem/transfer_engine.h"
#include "model/model_compute_buffers.h"

namespace ferry::model {

using detail::bf16_view;
using detail::f32_view;
using detail::i32_view;
using detail::reshaped;
using detail::rows_of;
using kernels::Stream;

ModelCompute::ModelCompute(const DecoderGeometry& geo, std::int64_t max_tokens,
                           kernels::Backend& backend)
    : geo_(geo), max_tokens_(max_tokens), be_(backend) {}
ModelCompute::~ModelCompute() = default;

namespace {

Status check_geometry(const DecoderGeometry& geo, std::int64_t max_tokens,
                      kernels::Backend& backend, int work_layers, const std::vector<bool>& kept) {
  if (max_tokens <= 0) return invalid_argument("model: max_tokens must be positive");
  if (geo.layers <= 0 || geo.hidden <= 0 || geo.heads <= 0 || geo.kv_heads <= 0 ||
      geo.head_dim <= 0 || geo.vocab <= 0) {
    return invalid_argument("model: geometry has a non-positive size");
  }
  if (geo.heads % geo.kv_heads != 0) {
    return invalid_argument("model: {} heads not divisible by {} kv heads", geo.heads,
                            geo.kv_heads);
  }
  if (static_cast<int>(geo.layer_is_moe.size()) != geo.layers) {
    return invalid_argument("model: layer_is_moe has {} entries for {} layers",
                            geo.layer_is_moe.size(), geo.layers);
  }
  if (work_layers < 1 || work_layers > geo.layers) {
    return invalid_argument("model: work_layers {} outside [1, {}]", work_layers, geo.layers);
  }
  if (!kept.empty() && static_cast<int>(kept.size()) != geo.layers) {
    return invalid_argument("model: kept_layers has {} entries for {} layers", kept.size(),
                            geo.layers);
  }
  if (backend.device() != Device::kCpu &&
      (backend.device() != Device::kCuda || mem::device_tier_is_host_memory())) {
    return unavailable("model: ModelCompute on backend {} needs device memory (built without CUDA)",
                       backend.name());
  }
  return {};
}

std::size_t ce_workspace_bytes(const DecoderGeometry& geo, std::int64_t T,
                               kernels::Backend& backend) {
  // Sized for the backward too (d_hidden given): some backends need room for d_logits.
  kernels::CrossEntropyArgs probe;
  probe.hidden = ConstTensorView::contiguous(nullptr, DType::kF32, Device::kCpu,
                                             {T, std::int64_t(geo.hidden)});
  probe.weight = ConstTensorView::contiguous(nullptr, DType::kF32, Device::kCpu,
                                             {geo.vocab, std::int64_t(geo.hidden)});
  // Only the shapes and presence of the views matter to workspace_bytes(); nothing is read.
  static float never_read = 0.0f;
  probe.d_hidden =
      TensorView::contiguous(&never_read, DType::kF32, Device::kCpu, {T, std::int64_t(geo.hidden)});
  probe.chunk_tokens = detail::ce_chunk_tokens(geo.vocab, backend.device());
  return backend.workspace_bytes(probe);
}

// The attention backward's optional workspace for T tokens (AttnBwdWorkspace in the header): what
// the backend asks for with the attention's shapes and dtypes (CUDA: the dK/dV partials of grouped
// heads, none when H == G; with FERRY_ATTN_BWD_DQ=atomic also dQ's accumulator, for any H, G).
std::size_t attn_bwd_workspace_bytes(const DecoderGeometry& geo, std::int64_t T,
                                     kernels::Backend& backend) {
  const DType dt =
      backend.supports(kernels::OpKind::kAttention, DType::kF32) ? DType::kF32 : DType::kBF16;
  const std::int64_t H = geo.heads, G = geo.kv_heads, D = geo.head_dim;
  // Only the shapes matter to workspace_bytes(); nothing is read or written.
  auto shaped = [&](std::int64_t heads) {
    return TensorView::contiguous(nullptr, dt, backend.device(), {T, heads, D});
  };
  kernels::AttentionBackwardArgs probe;
  probe.d_q = shaped(H);
  probe.d_k = shaped(G);
  probe.d_v = shaped(G);
  probe.d_out = probe.q = probe.out = shaped(H);
  probe.k = probe.v = shaped(G);
  probe.lse = TensorView::contiguous(nullptr, DType::kF32, backend.device(), {H, T});
  return backend.workspace_bytes(probe);
}

bool read_attn_bwd_workspace_env() {
  const char* e = std::getenv("FERRY_ATTN_BWD_WORKSPACE");
  return e == nullptr || std::string_view(e) != "0";
}

// Workspace w serves layers w, w + n, w + 2n, ...: it is MoE-sized if any of them is MoE, and
// dense-sized if any of them is dense.
void workspace_kinds(const DecoderGeometry& geo, int w, int n, bool* moe, bool* dense) {
  *moe = *dense = false;
  for (int l = w; l < geo.layers; l += n) (geo.layer_is_moe[l] ? *moe : *dense) = true;
}

bool resolve(AttnBwdWorkspace w) {
  return w == AttnBwdWorkspace::kDefault ? attn_bwd_workspace_default()
                                         : w == AttnBwdWorkspace::kOn;
}

}  // namespace

bool scratch_overlay_default() {
  const char* e = std::getenv("FERRY_SCRATCH_OVERLAY");
  return e == nullptr || std::string_view(e) != "0";
}

bool attn_bwd_workspace_default() {
  static const bool on = read_attn_bwd_workspace_env();
  return on;
}

void ModelCompute::plan_workspace(const DecoderGeometry& geo, std::int64_t T, bool moe, bool dense,
                                  bool kept, bool with_x_in, bool device, LayerActs& a,
                                  detail::BufferTable& tab, const std::string& p) {
  const std::int64_t C = geo.hidden, HD = std::int64_t(geo.heads) * geo.head_dim,
                     GD = std::int64_t(geo.kv_heads) * geo.head_dim, H = geo.heads,
                     G = geo.kv_heads, F = geo.mlp_width, Fe = geo.expert_width, E = geo.experts,
                     K = geo.top_k;
  // The whole-model path keeps every boundary in its layer's workspace; per-layer callers own
  // the boundaries.
  if (with_x_in) tab.add(a.x_in, p + "x_in", T * C);
  tab.add(a.h1, p + "h1", T * C);
  tab.add(a.rstd1, p + "rstd1", T);
  if (geo.qk_norm != QkNorm::kNone) {
    tab.add(a.q_pre, p + "q_pre", T * HD);
    tab.add(a.k_pre, p + "k_pre", T * GD);
    tab.add(a.q_rstd, p + "q_rstd", geo.qk_norm == QkNorm::kPerHead ? T * H : T);
    tab.add(a.k_rstd, p + "k_rstd", geo.qk_norm == QkNorm::kPerHead ? T * G : T);
  }
  tab.add(a.q, p + "q", T * HD);
  tab.add(a.k, p + "k", T * GD);
  tab.add(a.v, p + "v", T * GD);
  tab.add(a.attn, p + "attn", T * HD);
  tab.add(a.lse, p + "lse", H * T);
  tab.add(a.x_mid, p + "x_mid", T * C);
  tab.add(a.h2, p + "h2", T * C);
  tab.add(a.rstd2, p + "rstd2", T);
  if (moe) {
    tab.add(a.router_logits, p + "router_logits", T * E);
    tab.add(a.probs, p + "probs", T * E);
    tab.add(a.weights, p + "weights", T * K);
    tab.add(a.ids, p + "ids", T * K);
    tab.add(a.slot_of, p + "slot_of", T * K);
    tab.add(a.offsets, p + "offsets", E + 1);
    tab.add(a.gathered, p + "gathered", T * K * C);
    tab.add(a.egate, p + "egate", T * K * Fe);
    tab.add(a.eup, p + "eup", T * K * Fe);
    tab.add(a.eact, p + "eact", T * K * Fe);
    tab.add(a.eout, p + "eout", T * K * C);
    if (device) a.h_offsets.resize(E + 1);
  }
  if (dense) {
    tab.add(a.gate, p + "gate", T * F);
    tab.add(a.up, p + "up", T * F);
    // A kept layer does not keep act = swiglu(gate, up): create() points it at the shared
    // workspace's, and the backward recomputes it when a later forward overwrote it.
    if (!kept) tab.add(a.act, p + "act", T * F);
  }
}

void ModelCompute::plan_buffers(const DecoderGeometry& geo, std::int64_t T, int work_layers,
                                const std::vector<bool>& kept, kernels::Backend& backend,
                                GemmPrecision precision, bool attn_ws, std::vector<LayerActs>& acts,
                                std::vector<int>& workspace_of, Scratch& s,
                                detail::BufferTable& tab, std::size_t* activation_bytes,
                                std::size_t* kept_bytes) {
  const bool whole = work_layers == geo.layers;
  const bool device = backend.device() != Device::kCpu;
  const bool bf16_attn = !backend.supports(kernels::OpKind::kAttention, DType::kF32);
  const std::int64_t C = geo.hidden, HD = std::int64_t(geo.heads) * geo.head_dim,
                     GD = std::int64_t(geo.kv_heads) * geo.head_dim, F = geo.mlp_width,
                     Fe = geo.expert_width, E = geo.experts, K = geo.top_k;
  // The layer -> workspace map: kept layers get workspaces work_layers, work_layers + 1, ...
  workspace_of.assign(static_cast<std::size_t>(geo.layers), 0);
  int n_kept = 0;
  for (int l = 0; l < geo.layers; ++l) {
    const bool k = !kept.empty() && kept[static_cast<std::size_t>(l)];
    workspace_of[static_cast<std::size_t>(l)] = k ? work_layers + n_kept++ : l % work_layers;
  }
  acts.resize(static_cast<std::size_t>(work_layers + n_kept));
  // The kept layers' workspaces lead the table: each then starts at a 256-aligned offset and adds
  // exactly kept_layer_bytes() in front of the rest, whatever else is planned. Sized for the
  // layer's own kind only, without a dense layer's act (the shared workspaces stay sized for every
  // layer mapped to them by l % work_layers, kept or not, so keeping a layer changes nothing else,
  // and a kept dense layer's act can be the shared workspace's: create()).
  for (int l = 0; l < geo.layers; ++l) {
    const int w = workspace_of[static_cast<std::size_t>(l)];
    if (w < work_layers) continue;
    const bool moe = geo.layer_is_moe[static_cast<std::size_t>(l)];
    plan_workspace(geo, T, moe, !moe, /*kept=*/true, false, device,
                   acts[static_cast<std::size_t>(w)], tab, fmt::format("kept{}.", l));
  }
  *kept_bytes = tab.plan().total_bytes() == 0
                    ? 0
                    : mem::detail::align_up(tab.plan().total_bytes(), mem::detail::kMinAlignBytes);
  for (int w = 0; w < work_layers; ++w) {
    bool moe = false, dense = false;
    workspace_kinds(geo, w, work_layers, &moe, &dense);
    plan_workspace(geo, T, moe, dense, /*kept=*/false, whole, device,
                   acts[static_cast<std::size_t>(w)], tab, fmt::format("l{}.", w));
  }
  *activation_bytes = tab.plan().total_bytes();
  if (whole) tab.add(s.x_final, "x_final", T * C);
  tab.add(s.hf, "hf", T * C);
  tab.add(s.rstd_f, "rstd_f", T);
  tab.add(s.nll, "nll", T);
  tab.add(s.ones, "ones", T);
  tab.add(s.inv_freq, "inv_freq", static_cast<std::int64_t>(geo.rope.inv_freq.size()));
  if (device) {
    tab.add(s.zeros, "zeros", E > 0 ? T * C : (geo.padding_idx >= 0 ? C : 0));
    s.h_nll.resize(T);
    s.h_ids.resize(T);
    s.h_target.resize(T);
  }
  tab.add(s.tmp_c, "tmp_c", T * C);
  tab.add(s.dx, "dx", T * C);
  tab.add(s.dx_mid, "dx_mid", T * C);
  tab.add(s.dh, "dh", T * C);
  // bf16 attention's buffers: [q|dq]16 and [o|do]16 are [T, H D], [k|v|dk|dv]16 [T, G D].
  auto add_attn16 = [&](Bf16Buf& a, const char* an, Bf16Buf& b, const char* bn, Bf16Buf& c,
                        const char* cn, Bf16Buf& d, const char* dn) {
    if (!bf16_attn) return;
    tab.add(a, an, T * HD);
    tab.add(b, bn, T * GD);
    tab.add(c, cn, T * GD);
    tab.add(d, dn, T * HD);
  };
  // The forward's copies of q/k/v/out carry its values into the backward (attn16_): outside the
  // overlay below.
  add_attn16(s.q16, "q16", s.k16, "k16", s.v16, "v16", s.o16, "o16");
  if (precision == GemmPrecision::kBf16) plan_linear_buffers(geo, T, backend, s, tab);
  // The scratch overlay (scratch_overlay_default(), model_compute.h): four sets whose lifetimes
  // never overlap share one region as large as the largest. Each set is written before it is
  // read inside one call and dead when the call returns, and the calls run one after another on
  // one stream:
  //   attention backward (attention_backward(): d_attn .. dq/dk/dv, their bf16 twins, the
  //     kernel's workspace); dense MLP backward (mlp_backward(): d_act, d_gate, d_up); MoE
  //     backward (moe_backward()); the loss head (run_head_forward() / run_head_backward() /
  //     forward()'s logits: the fused cross-entropy's chunk workspace and the bf16 operands
  //     hf16 / head16, recast at every call).
  // What crosses those calls stays outside: dx, dx_mid, dh, tmp_c, the layer activations, the
  // forward's bf16 q/k/v/out, the GEMM operand buffers x16 / dy16 / w16 (a layer's backward may
  // reuse its forward's rounded act from x16).
  tab.begin_overlay("backward_overlay", scratch_overlay_default());
  tab.add(s.dq, "dq", T * HD);
  tab.add(s.dk, "dk", T * GD);
  tab.add(s.dv, "dv", T * GD);
  tab.add(s.dq_pre, "dq_pre", T * HD);
  tab.add(s.dk_pre, "dk_pre", T * GD);
  tab.add(s.d_attn, "d_attn", T * HD);
  add_attn16(s.dq16, "dq16", s.dk16, "dk16", s.dv16, "dv16", s.do16, "do16");
  // One for all layers (they run one at a time), sized for the largest T.
  if (attn_ws) {
    tab.add(s.attn_workspace, "attn_bwd_workspace",
            static_cast<std::int64_t>(attn_bwd_workspace_bytes(geo, T, backend)));
  }
  tab.next_alternative();
  tab.add(s.d_act, "d_act", T * F);
  tab.add(s.d_gate, "d_gate", T * F);
  tab.add(s.d_up, "d_up", T * F);
  tab.next_alternative();
  if (E > 0) {
    tab.add(s.d_eout, "d_eout", T * K * C);
    tab.add(s.d_gathered, "d_gathered", T * K * C);
    tab.add(s.d_eact, "d_eact", T * K * Fe);
    tab.add(s.d_egate, "d_egate", T * K * Fe);
    tab.add(s.d_eup, "d_eup", T * K * Fe);
    tab.add(s.d_weights, "d_weights", T * K);
    tab.add(s.d_router_logits, "d_router_logits", T * E);
  }
  tab.next_alternative();
  if (precision == GemmPrecision::kBf16) plan_head_operands(geo, T, backend, s, tab);
  tab.add(s.ce_workspace, "ce_workspace",
          static_cast<std::int64_t>(ce_workspace_bytes(geo, T, backend)));
  tab.end_overlay();
}

Result<std::unique_ptr<ModelCompute>> ModelCompute::create(
    const DecoderGeometry& geo, std::int64_t max_tokens, kernels::Backend& backend, int work_layers,
    Stream* stream, GemmPrecision precision, AttnBwdWorkspace attn_ws,
    const std::vector<bool>& kept_layers) {
  if (work_layers < 0) work_layers = geo.layers;
  FERRY_TRY(check_geometry(geo, max_tokens, backend, work_layers, kept_layers));
  const Device dev = backend.device();
  if (stream == nullptr) {
    if (dev != Device::kCpu) {
      return invalid_argument("model: backend {} needs a CUDA stream (create()'s stream argument)",
                              backend.name());
    }
    stream = &Stream::host();
  }
  if (stream->device() != dev) {
    return invalid_argument("model: a {} stream given for backend {}", to_string(stream->device()),
                            backend.name());
  }
  std::unique_ptr<ModelCompute> mc(new ModelCompute(geo, max_tokens, backend));
  mc->stream_ = stream;
  mc->dev_ = dev;
  mc->attn_bf16_ = !backend.supports(kernels::OpKind::kAttention, DType::kF32);
  mc->precision_ = precision;
  mc->native_bf16_gemm_ = backend.supports(kernels::OpKind::kGemm, DType::kBF16);
  mc->gemm_input_reuse_ = gemm_input_reuse_default();
  auto s = std::make_unique<Scratch>();
  detail::BufferTable table;
  mc->work_layers_ = work_layers;
  plan_buffers(geo, max_tokens, work_layers, kept_layers, backend, precision, resolve(attn_ws),
               mc->acts_, mc->workspace_of_, *s, table, &mc->activation_bytes_, &mc->kept_bytes_);
  mc->kept_count_ = static_cast<int>(mc->acts_.size()) - work_layers;
  const mem::MemTier tier =
      dev == Device::kCpu ? mem::MemTier::kPageableHost : mem::MemTier::kDevice;
  mc->budget_ = std::make_unique<mem::MemoryBudget>(tier);
  FERRY_ASSIGN_OR_RETURN(mem::Arena arena, mem::make_arena(table.plan(), tier, *mc->budget_,
                                                           {.device = stream->device_index(),
                                                            .what = "model compute activations"}));
  mc->arena_ = std::make_unique<mem::Arena>(std::move(arena));
  table.bind(*mc->arena_, dev);
  // A kept dense layer's act is the shared workspace's (l % work_layers serves layer l's kind
  // too: workspace_kinds counts kept layers), whose holder act_holder_ tracks.
  for (int l = 0; l < geo.layers; ++l) {
    if (!mc->layer_kept(l) || geo.layer_is_moe[static_cast<std::size_t>(l)]) continue;
    const F32Buf& shared = mc->acts_[static_cast<std::size_t>(l % work_layers)].act;
    FERRY_CHECK(shared.n == max_tokens * geo.mlp_width, "model: kept layer {} has no shared act",
                l);
    mc->acts_[static_cast<std::size_t>(mc->workspace_of(l))].act = shared;
  }
  mc->act_holder_.assign(static_cast<std::size_t>(work_layers), ActHolder{});
  if (dev == Device::kCpu) {
    mc->te_ = &mem::host_transfer_engine();
  } else {
    FERRY_ASSIGN_OR_RETURN(mc->own_te_, mem::cuda_transfer_engine(stream->device_index()));
    mc->te_ = mc->own_te_.get();
  }
  // Constants: ones (bias gradients), the rope frequencies, zeros (device zero fills).
  const std::vector<float> ones(static_cast<std::size_t>(s->ones.n), 1.0f);
  const std::vector<float> zeros(static_cast<std::size_t>(s->zeros.n), 0.0f);
  for (auto [dst, src, n] : {std::tuple{s->ones.ptr, ones.data(), ones.size()},
                             {s->inv_freq.ptr, geo.rope.inv_freq.data(), geo.rope.inv_freq.size()},
                             {s->zeros.ptr, zeros.data(), zeros.size()}}) {
    if (n > 0) FERRY_TRY(mc->te_->h2d(dst, src, n * sizeof(float), *stream));
  }
  FERRY_TRY(stream->synchronize());  // the host vectors above die here
  mc->scratch_ = std::move(s);
  return mc;
}

Result<std::size_t> ModelCompute::planned_bytes(const DecoderGeometry& geo, std::int64_t max_tokens,
                                                kernels::Backend& backend, int work_layers,
                                                GemmPrecision precision, AttnBwdWorkspace attn_ws,
                                                const std::vector<bool>& kept_layers) {
  if (work_layers < 0) work_layers = geo.layers;
  FERRY_TRY(check_geometry(geo, max_tokens, backend, work_layers, kept_layers));
  std::vector<LayerActs> acts;
  std::vector<int> workspace_of;
  Scratch s;
  detail::BufferTable table;
  std::size_t activation = 0, kept = 0;
  plan_buffers(geo, max_tokens, work_layers, kept_layers, backend, precision, resolve(attn_ws),
               acts, workspace_of, s, table, &activation, &kept);
  return table.plan().allocation_bytes();
}

Result<std::size_t> ModelCompute::kept_layer_bytes(const DecoderGeometry& geo, int layer,
                                                   std::int64_t max_tokens,
                                                   kernels::Backend& backend,
                                                   GemmPrecision /*precision*/) {
  FERRY_TRY(check_geometry(geo, max_tokens, backend, 1, {}));
  if (layer < 0 || layer >= geo.layers) {
    return invalid_argument("model: kept layer {} outside [0, {})", layer, geo.layers);
  }
  // The same workspace plan_buffers gives a kept layer, alone in a table that starts aligned.
  LayerActs a;
  detail::BufferTable table;
  const bool moe = geo.layer_is_moe[static_cast<std::size_t>(layer)];
  plan_workspace(geo, max_tokens, moe, !moe, /*kept=*/true, false, backend.device() != Device::kCpu,
                 a, table, "kept.");
  return mem::detail::align_up(table.plan().total_bytes(), mem::detail::kMinAlignBytes);
}

std::size_t ModelCompute::total_bytes() const { return arena_->plan().allocation_bytes(); }

std::size_t ModelCompute::activation_bytes() const { return activation_bytes_; }

std::size_t ModelCompute::attention_workspace_bytes() const {
  return static_cast<std::size_t>(scratch_->attn_workspace.n);
}

template <typename T>
Result<const T*> ModelCompute::read_to_host(const T* src, std::vector<T>& mirror, std::int64_t n) {
  if (dev_ == Device::kCpu) return src;
  FERRY_CHECK(static_cast<std::int64_t>(mirror.size()) >= n, "model: host copy of {} for {}",
              mirror.size(), n);
  FERRY_TRY(te_->d2h(mirror.data(), src, static_cast<std::size_t>(n) * sizeof(T), st()));
  FERRY_TRY(st().synchronize());
  return static_cast<const T*>(mirror.data());
}
template Result<const float*> ModelCompute::read_to_host(const float*, std::vector<float>&,
                                                         std::int64_t);
template Result<const std::int32_t*> ModelCompute::read_to_host(const std::int32_t*,
                                                                std::vector<std::int32_t>&,
                                                                std::int64_t);

Status ModelCompute::zero_fill(float* p, std::int64_t n) {
  if (dev_ == Device::kCpu) {
    std::memset(p, 0, static_cast<std::size_t>(n) * sizeof(float));
    return {};
  }
  const F32Buf& z = scratch_->zeros;
  FERRY_CHECK(n <= z.n, "model: zero fill of {} floats, {} planned", n, z.n);
  return te_->d2d(p, z.ptr, static_cast<std::size_t>(n) * sizeof(float), st());
}

Status ModelCompute::attention_forward(LayerActs& a, const LayerTensors<ConstTensorView>& p,
                                       std::int64_t T, const PackedBatch& batch, const float* x_in,
                                       const GemmInput& h1_in) {
  const std::int64_t C = geo_.hidden, H = geo_.heads, G = geo_.kv_heads, D = geo_.head_dim;
  const bool normed = geo_.qk_norm != QkNorm::kNone;
  // Projections: into q_pre/k_pre when a q/k norm follows, else straight into q/k.
  const TensorView q_proj = normed ? f32_view(a.q_pre, {T, H * D}) : f32_view(a.q, {T, H * D});
  const TensorView k_proj = normed ? f32_view(a.k_pre, {T, G * D}) : f32_view(a.k, {T, G * D});
  // h1 as the norm left it: one rounding for the three projections (reuse on).
  FERRY_TRY(linear(q_proj, h1_in, p.q, p.q_bias));
  FERRY_TRY(linear(k_proj, h1_in, p.k, p.k_bias));
  FERRY_TRY(linear(f32_view(a.v, {T, G * D}), h1_in, p.v, p.v_bias));
  if (geo_.qk_norm == QkNorm::kPerHead) {
    FERRY_TRY(be_.rms_norm({.out = f32_view(a.q, {T * H, D}),
                            .rstd = f32_view(a.q_rstd, {T * H}),
                            .in = f32_view(a.q_pre, {T * H, D}),
                            .weight = p.q_norm,
                            .eps = geo_.rms_eps},
                           st()));
    FERRY_TRY(be_.rms_norm({.out = f32_view(a.k, {T * G, D}),
                            .rstd = f32_view(a.k_rstd, {T * G}),
                            .in = f32_view(a.k_pre, {T * G, D}),
                            .weight = p.k_norm,
                            .eps = geo_.rms_eps},
                           st()));
  } else if (geo_.qk_norm == QkNorm::kFullWidth) {
    FERRY_TRY(be_.rms_norm({.out = f32_view(a.q, {T, H * D}),
                            .rstd = f32_view(a.q_rstd, {T}),
                            .in = f32_view(a.q_pre, {T, H * D}),
                            .weight = p.q_norm,
                            .eps = geo_.rms_eps},
                           st()));
    FERRY_TRY(be_.rms_norm({.out = f32_view(a.k, {T, G * D}),
                            .rstd = f32_view(a.k_rstd, {T}),
                            .in = f32_view(a.k_pre, {T, G * D}),
                            .weight = p.k_norm,
                            .eps = geo_.rms_eps},
                           st()));
  }
  const ConstTensorView inv_freq = f32_view(scratch_->inv_freq, {scratch_->inv_freq.n});
  FERRY_TRY(be_.rope({.x = f32_view(a.q, {T, H, D}),
                      .positions = batch.positions,
                      .inv_freq = inv_freq,
                      .attention_scaling = geo_.rope.attention_scaling},
                     st()));
  FERRY_TRY(be_.rope({.x = f32_view(a.k, {T, G, D}),
                      .positions = batch.positions,
                      .inv_freq = inv_freq,
                      .attention_scaling = geo_.rope.attention_scaling},
                     st()));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (!attn_bf16_) {
    FERRY_TRY(be_.attention({.out = f32_view(a.attn, {T, H, D}),
                             .lse = f32_view(a.lse, {H, T}),
                             .q = f32_view(a.q, {T, H, D}),
                             .k = f32_view(a.k, {T, G, D}),
                             .v = f32_view(a.v, {T, G, D}),
                             .cu_seqlens = batch.cu_seqlens,
                             .scale = scale},
                            st()));
  } else {
    // bf16-only attention: cast q, k, v down, the output back up (lse stays f32).
    Scratch& s = *scratch_;
    FERRY_TRY(
        be_.convert({.out = bf16_view(s.q16, {T, H, D}), .in = f32_view(a.q, {T, H, D})}, st()));
    FERRY_TRY(
        be_.convert({.out = bf16_view(s.k16, {T, G, D}), .in = f32_view(a.k, {T, G, D})}, st()));
    FERRY_TRY(
        be_.convert({.out = bf16_view(s.v16, {T, G, D}), .in = f32_view(a.v, {T, G, D})}, st()));
    FERRY_TRY(be_.attention({.out = bf16_view(s.o16, {T, H, D}),
                             .lse = f32_view(a.lse, {H, T}),
                             .q = bf16_view(s.q16, {T, H, D}),
                             .k = bf16_view(s.k16, {T, G, D}),
                             .v = bf16_view(s.v16, {T, G, D}),
                             .cu_seqlens = batch.cu_seqlens,
                             .scale = scale},
                            st()));
    FERRY_TRY(
        be_.convert({.out = f32_view(a.attn, {T, H, D}), .in = bf16_view(s.o16, {T, H, D})}, st()));
  }
  // x_mid = x_in + attn Wo^T
  const TensorView tmp = f32_view(scratch_->tmp_c, {T, C});
  FERRY_TRY(linear(tmp, f32_view(a.attn, {T, H * D}), p.o, p.o_bias));
  return be_.add({.out = f32_view(a.x_mid, {T, C}),
                  .a = ConstTensorView::contiguous(x_in, DType::kF32, dev_, {T, C}),
                  .b = tmp},
                 st());
}

Status ModelCompute::mlp_forward(int l, LayerActs& a, const LayerTensors<ConstTensorView>& p,
                                 std::int64_t T, const GemmInput& h2_in, bool with_output) {
  const std::int64_t C = geo_.hidden, F = geo_.mlp_width;
  // h2 as the norm left it: one rounding for gate and up (reuse on).
  FERRY_TRY(linear(f32_view(a.gate, {T, F}), h2_in, p.gate));
  FERRY_TRY(linear(f32_view(a.up, {T, F}), h2_in, p.up));
  FERRY_ASSIGN_OR_RETURN(const GemmInput act_in,
                         swiglu_into_gemm_input(f32_view(a.act, {T, F}), f32_view(a.gate, {T, F}),
                                                f32_view(a.up, {T, F})));
  act_holder_[static_cast<std::size_t>(l % work_layers_)] = {l, &a, T};
  if (gemm_input_reuse_ && precision_ == GemmPrecision::kBf16) {
    // gemm.x16 now holds this layer's act in bf16: the backward's dW of down may read it.
    act16_layer_ = l;
    act16_acts_ = &a;
    act16_shape_[0] = T;
    act16_shape_[1] = F;
  }
  if (!with_output) return {};
  return linear(f32_view(scratch_->tmp_c, {T, C}), act_in, p.down);
}

Status ModelCompute::moe_forward(LayerActs& a, const LayerTensors<ConstTensorView>& p,
                                 std::int64_t T, bool with_output) {
  const std::int64_t C = geo_.hidden, E = geo_.experts, K = geo_.top_k, Fe = geo_.expert_width;
  const ConstTensorView h2 = f32_view(a.h2, {T, C});
  FERRY_TRY(linear(f32_view(a.router_logits, {T, E}), h2, p.router, {}, /*f32_operands=*/true));
  FERRY_TRY(be_.router({.weights = f32_view(a.weights, {T, K}),
                        .ids = i32_view(a.ids, {T, K}),
                        .probs = f32_view(a.probs, {T, E}),
                        .logits = f32_view(a.router_logits, {T, E}),
                        .top_k = geo_.top_k,
                        .renormalize = geo_.renormalize_topk},
                       st()));
  FERRY_TRY(be_.moe_dispatch({.gathered = f32_view(a.gathered, {T * K, C}),
                              .expert_offsets = i32_view(a.offsets, {E + 1}),
                              .slot_of = i32_view(a.slot_of, {T, K}),
                              .x = h2,
                              .ids = i32_view(a.ids, {T, K}),
                              .num_experts = geo_.experts},
                             st()));
  // The per-expert GEMMs need each expert's row range on the host.
  FERRY_ASSIGN_OR_RETURN(const std::int32_t* offsets,
                         read_to_host(a.offsets.ptr, a.h_offsets, E + 1));
  const TensorView gathered = f32_view(a.gathered, {T * K, C});
  const TensorView egate = f32_view(a.egate, {T * K, Fe}), eup = f32_view(a.eup, {T * K, Fe}),
                   eact = f32_view(a.eact, {T * K, Fe}), eout = f32_view(a.eout, {T * K, C});
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t r0 = offsets[e], r1 = offsets[e + 1];
    if (r1 == r0) continue;
    const ConstTensorView x_e = rows_of(ConstTensorView(gathered), r0, r1);
    FERRY_ASSIGN_OR_RETURN(const GemmInput x_in, shared_gemm_input(x_e));
    FERRY_TRY(linear(rows_of(egate, r0, r1), x_in, p.expert_gate[e]));
    FERRY_TRY(linear(rows_of(eup, r0, r1), x_in, p.expert_up[e]));
    FERRY_ASSIGN_OR_RETURN(
        const GemmInput act_in,
        swiglu_into_gemm_input(rows_of(eact, r0, r1), rows_of(ConstTensorView(egate), r0, r1),
                               rows_of(ConstTensorView(eup), r0, r1)));
    FERRY_TRY(linear(rows_of(eout, r0, r1), act_in, p.expert_down[e]));
  }
  if (!with_output) return {};
  return be_.moe_combine({.out = f32_view(scratch_->tmp_c, {T, C}),
                          .expert_out = eout,
                          .weights = f32_view(a.weights, {T, K}),
                          .slot_of = i32_view(a.slot_of, {T, K})},
                         st());
}

Status ModelCompute::run_layer_forward(int l, LayerActs& a, const LayerTensors<ConstTensorView>& p,
                                       std::int64_t T, const PackedBatch& batch, const float* x_in,
                                       float* x_out) {
  const std::int64_t C = geo_.hidden;
  // h1 = rms_norm(x_in), with the reuse on also h1's bf16 GEMM operand (gemm.x16) for q/k/v.
  FERRY_ASSIGN_OR_RETURN(
      const GemmInput h1_in,
      rms_norm_into_gemm_input({.out = f32_view(a.h1, {T, C}),
                                .rstd = f32_view(a.rstd1, {T}),
                                .in = ConstTensorView::contiguous(x_in, DType::kF32, dev_, {T, C}),
                                .weight = p.attn_norm,
                                .eps = geo_.rms_eps}));
  // The shared bf16 attention buffers get this layer's q/k/v/out (attention_backward reuses them).
  attn16_layer_ = -1;
  FERRY_TRY(attention_forward(a, p, T, batch, x_in, h1_in));
  if (attn_bf16_) {
    attn16_layer_ = l;
    attn16_tokens_ = T;
    attn16_acts_ = &a;
  }
  const kernels::RmsNormArgs norm2{.out = f32_view(a.h2, {T, C}),
                                   .rstd = f32_view(a.rstd2, {T}),
                                   .in = f32_view(a.x_mid, {T, C}),
                                   .weight = p.mlp_norm,
                                   .eps = geo_.rms_eps};
  if (geo_.layer_is_moe[l]) {
    // The experts read h2's rows gathered (rounded per expert), the router in f32: no copy.
    FERRY_TRY(be_.rms_norm(norm2, st()));
    FERRY_TRY(moe_forward(a, p, T, x_out != nullptr));
  } else {
    // h2 = rms_norm(x_mid), with the reuse on also h2's bf16 GEMM operand for gate/up.
    FERRY_ASSIGN_OR_RETURN(const GemmInput h2_in, rms_norm_into_gemm_input(norm2));
    FERRY_TRY(mlp_forward(l, a, p, T, h2_in, x_out != nullptr));
  }
  if (x_out == nullptr) return {};
  return be_.add({.out = TensorView::contiguous(x_out, DType::kF32, dev_, {T, C}),
                  .a = f32_view(a.x_mid, {T, C}),
                  .b = f32_view(scratch_->tmp_c, {T, C})},
                 st());
}

Status ModelCompute::check_layer_call(int l, const PackedBatch& batch,
                                      const ConstTensorView& x) const {
  const std::int64_t T = batch.ids.numel();
  if (T <= 0 || T > max_tokens_) {
    return invalid_argument("model: batch of {} tokens outside [1, {}] planned", T, max_tokens_);
  }
  if (l < -1 || l >= geo_.layers) return invalid_argument("model: layer {} out of range", l);
  if (x.dtype != DType::kF32 || !x.is_contiguous() || x.numel() != T * geo_.hidden ||
      x.device != dev_) {
    return invalid_argument("model: activation {} is not a contiguous f32 [{}, {}] on {}",
                            x.shape_string(), T, geo_.hidden, to_string(dev_));
  }
  return {};
}

Status ModelCompute::embed(const ConstTensorView& table, const PackedBatch& batch,
                           const TensorView& x0) {
  FERRY_TRY(check_layer_call(-1, batch, x0));
  const std::int64_t T = batch.ids.numel();
  return be_.embedding(
      {.out = reshaped(x0, {T, std::int64_t(geo_.hidden)}), .table = table, .ids = batch.ids},
      st());
}

Status ModelCompute::layer_forward(int l, const LayerTensors<ConstTensorView>& p,
                                   const PackedBatch& batch, const ConstTensorView& x_in,
                                   const TensorView& x_out) {
  FERRY_TRY(check_layer_call(l, batch, x_in));
  FERRY_TRY(check_layer_call(l, batch, x_out));
  return run_layer_forward(l, acts_[static_cast<std::size_t>(workspace_of(l))], p,
                           batch.ids.numel(), batch, x_in.as<float>(), x_out.as<float>());
}

Status ModelCompute::layer_forward_internals(int l, const LayerTensors<ConstTensorView>& p,
                                             const PackedBatch& batch,
                                             const ConstTensorView& x_in) {
  FERRY_TRY(check_layer_call(l, batch, x_in));
  ++internals_forwards_;
  return run_layer_forward(l, acts_[static_cast<std::size_t>(workspace_of(l))], p,
                           batch.ids.numel(), batch, x_in.as<float>(), nullptr);
}

Result<ForwardResult> ModelCompute::head_forward(const ConstTensorView& final_norm,
                                                 const ConstTensorView& lm_head,
                                                 const PackedBatch& batch,
                                                 const ConstTensorView& x_final,
                                                 TensorView nll_out) {
  FERRY_TRY(check_layer_call(-1, batch, x_final));
  if (batch.targets.empty_view()) return invalid_argument("model: head_forward needs targets");
  const std::int64_t T = batch.ids.numel(), C = geo_.hidden;
  Scratch& s = *scratch_;
  FERRY_TRY(be_.rms_norm({.out = f32_view(s.hf, {T, C}),
                          .rstd = f32_view(s.rstd_f, {T}),
                          .in = reshaped(x_final, {T, C}),
                          .weight = final_norm,
                          .eps = geo_.rms_eps},
                         st()));
  last_T_ = T;
  return run_head_forward(lm_head, batch, nll_out);
}

// Cross-entropy of the final norm's output (s.hf) against the targets.
Result<ForwardResult> ModelCompute::run_head_forward(const ConstTensorView& lm_head,
                                                     const PackedBatch& batch, TensorView nll_out) {
  const std::int64_t T = batch.ids.numel(), C = geo_.hidden;
  Scratch& s = *scratch_;
  ForwardResult res;
  const TensorView nll = f32_view(s.nll, {T});
  FERRY_ASSIGN_OR_RETURN(const ConstTensorView hidden,
                         gemm_operand(f32_view(s.hf, {T, C}), s.hf16, s.hf16_f));
  FERRY_ASSIGN_OR_RETURN(const ConstTensorView weight, gemm_operand(lm_head, s.head16, s.head16_f));
  FERRY_TRY(be_.cross_entropy(
      {.nll = nll,
       .workspace = detail::typed_view(s.ce_workspace, DType::kU8, {s.ce_workspace.n}),
       .hidden = hidden,
       .weight = weight,
       .targets = batch.targets,
       .chunk_tokens = detail::ce_chunk_tokens(geo_.vocab, dev_)},
      st()));
  if (!nll_out.empty_view()) {
    if (nll_out.device != dev_ || nll_out.dtype != DType::kF32 || nll_out.numel() != T) {
      return invalid_argument("model: nll_out {} is not an f32 [{}] on {}", nll_out.shape_string(),
                              T, to_string(dev_));
    }
    FERRY_TRY(te_->d2d(nll_out.data, s.nll.ptr, static_cast<std::size_t>(T) * sizeof(float), st()));
  }
  // The loss sum is read on the host (device: copies back and waits for the stream).
  FERRY_ASSIGN_OR_RETURN(const std::int32_t* tg,
                         read_to_host(batch.targets.as<std::int32_t>(), s.h_target, T));
  FERRY_ASSIGN_OR_RETURN(const float* nll_h, read_to_host(s.nll.ptr, s.h_nll, T));
  for (std::int64_t t = 0; t < T; ++t) {
    if (tg[t] == -100) continue;
    res.loss_sum += nll_h[t];
    ++res.counted;
  }
  last_counted_ = res.counted;
  return res;
}

Result<ForwardResult> ModelCompute::forward(const ModelParams& params, const PackedBatch& batch,
                                            TensorView nll_out, TensorView logits_out) {
  const std::int64_t T = batch.ids.numel();
  if (T <= 0 || T > max_tokens_) {
    return invalid_argument("model: batch of {} tokens outside [1, {}] planned", T, max_tokens_);
  }
  if (batch.positions.numel() != T) {
    return invalid_argument("model: {} positions for {} tokens", batch.positions.numel(), T);
  }
  if (static_cast<int>(params.layers.size()) != geo_.layers) {
    return invalid_argument("model: {} layer parameter sets for {} layers", params.layers.size(),
                            geo_.layers);
  }
  FERRY_CHECK(work_layers_ == geo_.layers,
              "model: whole-model forward on a ModelCompute created for the per-layer API");
  const std::int64_t C = geo_.hidden;
  FERRY_TRY(be_.embedding(
      {.out = f32_view(acts_[0].x_in, {T, C}), .table = params.embed, .ids = batch.ids}, st()));
  for (int l = 0; l < geo_.layers; ++l) {
    // The layer's output is the next layer's input (or the final norm's).
    F32Buf& x_out = (l + 1 < geo_.layers) ? acts_[l + 1].x_in : scratch_->x_final;
    FERRY_TRY(run_layer_forward(l, acts_[l], params.layers[l], T, batch, acts_[l].x_in.data(),
                                x_out.data()));
  }
  Scratch& s = *scratch_;
  FERRY_TRY(be_.rms_norm({.out = f32_view(s.hf, {T, C}),
                          .rstd = f32_view(s.rstd_f, {T}),
                          .in = f32_view(s.x_final, {T, C}),
                          .weight = params.final_norm,
                          .eps = geo_.rms_eps},
                         st()));
  if (!logits_out.empty_view()) {
    // The lm_head's operands live in the loss's buffers (the weight is [V, C], wider than w16).
    FERRY_ASSIGN_OR_RETURN(const ConstTensorView hidden,
                           gemm_operand(f32_view(s.hf, {T, C}), s.hf16, s.hf16_f));
    FERRY_ASSIGN_OR_RETURN(const ConstTensorView weight,
                           gemm_operand(params.lm_head, s.head16, s.head16_f));
    FERRY_TRY(be_.gemm({.out = logits_out, .a = hidden, .b = weight, .trans_b = true}, st()));
  }
  last_T_ = T;
  if (batch.targets.empty_view()) return ForwardResult{};
  return run_head_forward(params.lm_head, batch, nll_out);
}

}  // namespace ferry::model
