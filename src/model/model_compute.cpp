// SPDX-License-Identifier: Apache-2.0
// ModelCompute: buffer planning and the forward pass. The backward pass is in
// model_compute_backward.cpp. Read model_compute.h first.
#include "model/model_compute.h"

#include <cmath>

#include "model/model_compute_buffers.h"

namespace ferry::model {

using detail::f32_view;
using detail::i32_view;
using detail::reshaped;
using detail::rows_of;
using kernels::Stream;

using detail::host;
using detail::kCeChunkTokens;

ModelCompute::ModelCompute(const DecoderGeometry& geo, std::int64_t max_tokens,
                           kernels::Backend& backend)
    : geo_(geo), max_tokens_(max_tokens), be_(backend) {}
ModelCompute::~ModelCompute() = default;

namespace {

Status check_geometry(const DecoderGeometry& geo, std::int64_t max_tokens,
                      kernels::Backend& backend, int work_layers) {
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
  if (backend.device() != Device::kCpu) {
    return unimplemented(
        "model: ModelCompute keeps activations in host memory; backend {} "
        "needs device buffers (not written yet)",
        backend.name());
  }
  return {};
}

std::size_t ce_workspace_bytes(const DecoderGeometry& geo, std::int64_t T,
                               kernels::Backend& backend) {
  kernels::CrossEntropyArgs probe;
  probe.hidden = ConstTensorView::contiguous(nullptr, DType::kF32, Device::kCpu,
                                             {T, std::int64_t(geo.hidden)});
  probe.weight = ConstTensorView::contiguous(nullptr, DType::kF32, Device::kCpu,
                                             {geo.vocab, std::int64_t(geo.hidden)});
  probe.chunk_tokens = kCeChunkTokens;
  return backend.workspace_bytes(probe);
}

// Workspace w serves layers w, w + n, w + 2n, ...: it is MoE-sized if any of them is MoE, and
// dense-sized if any of them is dense.
void workspace_kinds(const DecoderGeometry& geo, int w, int n, bool* moe, bool* dense) {
  *moe = *dense = false;
  for (int l = w; l < geo.layers; l += n) (geo.layer_is_moe[l] ? *moe : *dense) = true;
}

}  // namespace

Result<std::unique_ptr<ModelCompute>> ModelCompute::create(const DecoderGeometry& geo,
                                                           std::int64_t max_tokens,
                                                           kernels::Backend& backend,
                                                           int work_layers) {
  if (work_layers < 0) work_layers = geo.layers;
  FERRY_TRY(check_geometry(geo, max_tokens, backend, work_layers));
  std::unique_ptr<ModelCompute> mc(new ModelCompute(geo, max_tokens, backend));
  const bool whole = work_layers == geo.layers;
  const std::int64_t T = max_tokens, C = geo.hidden, HD = std::int64_t(geo.heads) * geo.head_dim,
                     GD = std::int64_t(geo.kv_heads) * geo.head_dim, H = geo.heads,
                     G = geo.kv_heads, F = geo.mlp_width, Fe = geo.expert_width, E = geo.experts,
                     K = geo.top_k;
  mc->acts_.resize(work_layers);
  for (int w = 0; w < work_layers; ++w) {
    LayerActs& a = mc->acts_[w];
    bool moe = false, dense = false;
    workspace_kinds(geo, w, work_layers, &moe, &dense);
    // The whole-model path keeps every boundary in its layer's workspace; per-layer callers own
    // the boundaries.
    if (whole) a.x_in.resize(T * C);
    a.h1.resize(T * C);
    a.rstd1.resize(T);
    if (geo.qk_norm != QkNorm::kNone) {
      a.q_pre.resize(T * HD);
      a.k_pre.resize(T * GD);
      a.q_rstd.resize(geo.qk_norm == QkNorm::kPerHead ? T * H : T);
      a.k_rstd.resize(geo.qk_norm == QkNorm::kPerHead ? T * G : T);
    }
    a.q.resize(T * HD);
    a.k.resize(T * GD);
    a.v.resize(T * GD);
    a.attn.resize(T * HD);
    a.lse.resize(H * T);
    a.x_mid.resize(T * C);
    a.h2.resize(T * C);
    a.rstd2.resize(T);
    if (moe) {
      a.router_logits.resize(T * E);
      a.probs.resize(T * E);
      a.weights.resize(T * K);
      a.ids.resize(T * K);
      a.slot_of.resize(T * K);
      a.offsets.resize(E + 1);
      a.gathered.resize(T * K * C);
      a.egate.resize(T * K * Fe);
      a.eup.resize(T * K * Fe);
      a.eact.resize(T * K * Fe);
      a.eout.resize(T * K * C);
    }
    if (dense) {
      a.gate.resize(T * F);
      a.up.resize(T * F);
      a.act.resize(T * F);
    }
  }
  auto s = std::make_unique<Scratch>();
  if (whole) s->x_final.resize(T * C);
  s->hf.resize(T * C);
  s->rstd_f.resize(T);
  s->nll.resize(T);
  s->ones.assign(T, 1.0f);
  s->tmp_c.resize(T * C);
  s->dx.resize(T * C);
  s->dx_mid.resize(T * C);
  s->dh.resize(T * C);
  s->dq.resize(T * HD);
  s->dk.resize(T * GD);
  s->dv.resize(T * GD);
  s->dq_pre.resize(T * HD);
  s->dk_pre.resize(T * GD);
  s->d_attn.resize(T * HD);
  s->d_act.resize(T * F);
  s->d_gate.resize(T * F);
  s->d_up.resize(T * F);
  if (E > 0) {
    s->d_eout.resize(T * K * C);
    s->d_gathered.resize(T * K * C);
    s->d_eact.resize(T * K * Fe);
    s->d_egate.resize(T * K * Fe);
    s->d_eup.resize(T * K * Fe);
    s->d_weights.resize(T * K);
    s->d_router_logits.resize(T * E);
  }
  s->ce_workspace.resize(ce_workspace_bytes(geo, T, backend));
  mc->scratch_ = std::move(s);
  return mc;
}

Result<std::size_t> ModelCompute::planned_bytes(const DecoderGeometry& geo, std::int64_t max_tokens,
                                                kernels::Backend& backend, int work_layers) {
  if (work_layers < 0) work_layers = geo.layers;
  FERRY_TRY(check_geometry(geo, max_tokens, backend, work_layers));
  const bool whole = work_layers == geo.layers;
  const std::int64_t T = max_tokens, C = geo.hidden, HD = std::int64_t(geo.heads) * geo.head_dim,
                     GD = std::int64_t(geo.kv_heads) * geo.head_dim, H = geo.heads,
                     G = geo.kv_heads, F = geo.mlp_width, Fe = geo.expert_width, E = geo.experts,
                     K = geo.top_k;
  std::int64_t f32 = 0, i32 = 0;
  for (int w = 0; w < work_layers; ++w) {
    bool moe = false, dense = false;
    workspace_kinds(geo, w, work_layers, &moe, &dense);
    f32 += (whole ? T * C : 0) + T * C + T + T * HD + 2 * T * GD + T * HD + H * T + 2 * T * C + T;
    if (geo.qk_norm != QkNorm::kNone) {
      f32 += T * HD + T * GD + (geo.qk_norm == QkNorm::kPerHead ? T * (H + G) : 2 * T);
    }
    if (moe) {
      f32 += 2 * T * E + T * K + 2 * T * K * C + 3 * T * K * Fe;
      i32 += 2 * T * K + E + 1;
    }
    if (dense) f32 += 3 * T * F;
  }
  f32 += (whole ? T * C : 0) + T * C + 3 * T + 4 * T * C + 3 * T * HD + 3 * T * GD + 3 * T * F;
  if (E > 0) f32 += 2 * T * K * C + 3 * T * K * Fe + T * K + T * E;
  return static_cast<std::size_t>(f32) * sizeof(float) +
         static_cast<std::size_t>(i32) * sizeof(std::int32_t) + ce_workspace_bytes(geo, T, backend);
}

std::size_t ModelCompute::total_bytes() const {
  const Scratch& s = *scratch_;
  std::size_t n = activation_bytes() + s.ce_workspace.size();
  for (const auto* v : {&s.x_final, &s.hf,      &s.rstd_f, &s.nll,       &s.ones,
                        &s.tmp_c,   &s.dx,      &s.dx_mid, &s.dh,        &s.dq,
                        &s.dk,      &s.dv,      &s.dq_pre, &s.dk_pre,    &s.d_attn,
                        &s.d_act,   &s.d_gate,  &s.d_up,   &s.d_eout,    &s.d_gathered,
                        &s.d_eact,  &s.d_egate, &s.d_eup,  &s.d_weights, &s.d_router_logits}) {
    n += v->size() * sizeof(float);
  }
  return n;
}

std::size_t ModelCompute::activation_bytes() const {
  std::size_t n = 0;
  for (const auto& a : acts_) {
    for (const auto* v :
         {&a.x_in,     &a.h1,    &a.rstd1, &a.q_pre, &a.k_pre,         &a.q_rstd, &a.k_rstd,
          &a.q,        &a.k,     &a.v,     &a.attn,  &a.lse,           &a.x_mid,  &a.h2,
          &a.rstd2,    &a.gate,  &a.up,    &a.act,   &a.router_logits, &a.probs,  &a.weights,
          &a.gathered, &a.egate, &a.eup,   &a.eact,  &a.eout}) {
      n += v->size() * sizeof(float);
    }
    n += (a.ids.size() + a.slot_of.size() + a.offsets.size()) * sizeof(std::int32_t);
  }
  return n;
}

Status ModelCompute::attention_forward(LayerActs& a, const LayerTensors<ConstTensorView>& p,
                                       std::int64_t T, const PackedBatch& batch,
                                       const float* x_in) {
  const std::int64_t C = geo_.hidden, H = geo_.heads, G = geo_.kv_heads, D = geo_.head_dim;
  const ConstTensorView h1 = f32_view(a.h1, {T, C});
  const bool normed = geo_.qk_norm != QkNorm::kNone;
  // Projections: into q_pre/k_pre when a q/k norm follows, else straight into q/k.
  const TensorView q_proj = normed ? f32_view(a.q_pre, {T, H * D}) : f32_view(a.q, {T, H * D});
  const TensorView k_proj = normed ? f32_view(a.k_pre, {T, G * D}) : f32_view(a.k, {T, G * D});
  FERRY_TRY(
      be_.gemm({.out = q_proj, .a = h1, .b = p.q, .bias = p.q_bias, .trans_b = true}, host()));
  FERRY_TRY(
      be_.gemm({.out = k_proj, .a = h1, .b = p.k, .bias = p.k_bias, .trans_b = true}, host()));
  FERRY_TRY(be_.gemm(
      {.out = f32_view(a.v, {T, G * D}), .a = h1, .b = p.v, .bias = p.v_bias, .trans_b = true},
      host()));
  if (geo_.qk_norm == QkNorm::kPerHead) {
    FERRY_TRY(be_.rms_norm({.out = f32_view(a.q, {T * H, D}),
                            .rstd = f32_view(a.q_rstd, {T * H}),
                            .in = f32_view(a.q_pre, {T * H, D}),
                            .weight = p.q_norm,
                            .eps = geo_.rms_eps},
                           host()));
    FERRY_TRY(be_.rms_norm({.out = f32_view(a.k, {T * G, D}),
                            .rstd = f32_view(a.k_rstd, {T * G}),
                            .in = f32_view(a.k_pre, {T * G, D}),
                            .weight = p.k_norm,
                            .eps = geo_.rms_eps},
                           host()));
  } else if (geo_.qk_norm == QkNorm::kFullWidth) {
    FERRY_TRY(be_.rms_norm({.out = f32_view(a.q, {T, H * D}),
                            .rstd = f32_view(a.q_rstd, {T}),
                            .in = f32_view(a.q_pre, {T, H * D}),
                            .weight = p.q_norm,
                            .eps = geo_.rms_eps},
                           host()));
    FERRY_TRY(be_.rms_norm({.out = f32_view(a.k, {T, G * D}),
                            .rstd = f32_view(a.k_rstd, {T}),
                            .in = f32_view(a.k_pre, {T, G * D}),
                            .weight = p.k_norm,
                            .eps = geo_.rms_eps},
                           host()));
  }
  const ConstTensorView inv_freq =
      ConstTensorView::contiguous(geo_.rope.inv_freq.data(), DType::kF32, Device::kCpu,
                                  {static_cast<std::int64_t>(geo_.rope.inv_freq.size())});
  FERRY_TRY(be_.rope({.x = f32_view(a.q, {T, H, D}),
                      .positions = batch.positions,
                      .inv_freq = inv_freq,
                      .attention_scaling = geo_.rope.attention_scaling},
                     host()));
  FERRY_TRY(be_.rope({.x = f32_view(a.k, {T, G, D}),
                      .positions = batch.positions,
                      .inv_freq = inv_freq,
                      .attention_scaling = geo_.rope.attention_scaling},
                     host()));
  FERRY_TRY(be_.attention({.out = f32_view(a.attn, {T, H, D}),
                           .lse = f32_view(a.lse, {H, T}),
                           .q = f32_view(a.q, {T, H, D}),
                           .k = f32_view(a.k, {T, G, D}),
                           .v = f32_view(a.v, {T, G, D}),
                           .cu_seqlens = batch.cu_seqlens,
                           .scale = 1.0f / std::sqrt(static_cast<float>(D))},
                          host()));
  // x_mid = x_in + attn Wo^T
  const TensorView tmp = f32_view(scratch_->tmp_c, {T, C});
  FERRY_TRY(be_.gemm(
      {.out = tmp, .a = f32_view(a.attn, {T, H * D}), .b = p.o, .bias = p.o_bias, .trans_b = true},
      host()));
  return be_.add({.out = f32_view(a.x_mid, {T, C}),
                  .a = ConstTensorView::contiguous(x_in, DType::kF32, Device::kCpu, {T, C}),
                  .b = tmp},
                 host());
}

Status ModelCompute::mlp_forward(LayerActs& a, const LayerTensors<ConstTensorView>& p,
                                 std::int64_t T) {
  const std::int64_t C = geo_.hidden, F = geo_.mlp_width;
  const ConstTensorView h2 = f32_view(a.h2, {T, C});
  FERRY_TRY(
      be_.gemm({.out = f32_view(a.gate, {T, F}), .a = h2, .b = p.gate, .trans_b = true}, host()));
  FERRY_TRY(be_.gemm({.out = f32_view(a.up, {T, F}), .a = h2, .b = p.up, .trans_b = true}, host()));
  FERRY_TRY(be_.swiglu({.out = f32_view(a.act, {T, F}),
                        .gate = f32_view(a.gate, {T, F}),
                        .up = f32_view(a.up, {T, F})},
                       host()));
  return be_.gemm({.out = f32_view(scratch_->tmp_c, {T, C}),
                   .a = f32_view(a.act, {T, F}),
                   .b = p.down,
                   .trans_b = true},
                  host());
}

Status ModelCompute::moe_forward(LayerActs& a, const LayerTensors<ConstTensorView>& p,
                                 std::int64_t T) {
  const std::int64_t C = geo_.hidden, E = geo_.experts, K = geo_.top_k, Fe = geo_.expert_width;
  const ConstTensorView h2 = f32_view(a.h2, {T, C});
  FERRY_TRY(be_.gemm(
      {.out = f32_view(a.router_logits, {T, E}), .a = h2, .b = p.router, .trans_b = true}, host()));
  FERRY_TRY(be_.router({.weights = f32_view(a.weights, {T, K}),
                        .ids = i32_view(a.ids, {T, K}),
                        .probs = f32_view(a.probs, {T, E}),
                        .logits = f32_view(a.router_logits, {T, E}),
                        .top_k = geo_.top_k,
                        .renormalize = geo_.renormalize_topk},
                       host()));
  FERRY_TRY(be_.moe_dispatch({.gathered = f32_view(a.gathered, {T * K, C}),
                              .expert_offsets = i32_view(a.offsets, {E + 1}),
                              .slot_of = i32_view(a.slot_of, {T, K}),
                              .x = h2,
                              .ids = i32_view(a.ids, {T, K}),
                              .num_experts = geo_.experts},
                             host()));
  const TensorView gathered = f32_view(a.gathered, {T * K, C});
  const TensorView egate = f32_view(a.egate, {T * K, Fe}), eup = f32_view(a.eup, {T * K, Fe}),
                   eact = f32_view(a.eact, {T * K, Fe}), eout = f32_view(a.eout, {T * K, C});
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t r0 = a.offsets[e], r1 = a.offsets[e + 1];
    if (r1 == r0) continue;
    const ConstTensorView x_e = rows_of(ConstTensorView(gathered), r0, r1);
    FERRY_TRY(be_.gemm(
        {.out = rows_of(egate, r0, r1), .a = x_e, .b = p.expert_gate[e], .trans_b = true}, host()));
    FERRY_TRY(be_.gemm(
        {.out = rows_of(eup, r0, r1), .a = x_e, .b = p.expert_up[e], .trans_b = true}, host()));
    FERRY_TRY(be_.swiglu({.out = rows_of(eact, r0, r1),
                          .gate = rows_of(ConstTensorView(egate), r0, r1),
                          .up = rows_of(ConstTensorView(eup), r0, r1)},
                         host()));
    FERRY_TRY(be_.gemm({.out = rows_of(eout, r0, r1),
                        .a = rows_of(ConstTensorView(eact), r0, r1),
                        .b = p.expert_down[e],
                        .trans_b = true},
                       host()));
  }
  return be_.moe_combine({.out = f32_view(scratch_->tmp_c, {T, C}),
                          .expert_out = eout,
                          .weights = f32_view(a.weights, {T, K}),
                          .slot_of = i32_view(a.slot_of, {T, K})},
                         host());
}

Status ModelCompute::run_layer_forward(int l, LayerActs& a, const LayerTensors<ConstTensorView>& p,
                                       std::int64_t T, const PackedBatch& batch, const float* x_in,
                                       float* x_out) {
  const std::int64_t C = geo_.hidden;
  FERRY_TRY(
      be_.rms_norm({.out = f32_view(a.h1, {T, C}),
                    .rstd = f32_view(a.rstd1, {T}),
                    .in = ConstTensorView::contiguous(x_in, DType::kF32, Device::kCpu, {T, C}),
                    .weight = p.attn_norm,
                    .eps = geo_.rms_eps},
                   host()));
  FERRY_TRY(attention_forward(a, p, T, batch, x_in));
  FERRY_TRY(be_.rms_norm({.out = f32_view(a.h2, {T, C}),
                          .rstd = f32_view(a.rstd2, {T}),
                          .in = f32_view(a.x_mid, {T, C}),
                          .weight = p.mlp_norm,
                          .eps = geo_.rms_eps},
                         host()));
  FERRY_TRY(geo_.layer_is_moe[l] ? moe_forward(a, p, T) : mlp_forward(a, p, T));
  return be_.add({.out = TensorView::contiguous(x_out, DType::kF32, Device::kCpu, {T, C}),
                  .a = f32_view(a.x_mid, {T, C}),
                  .b = f32_view(scratch_->tmp_c, {T, C})},
                 host());
}

Status ModelCompute::check_layer_call(int l, const PackedBatch& batch,
                                      const ConstTensorView& x) const {
  const std::int64_t T = batch.ids.numel();
  if (T <= 0 || T > max_tokens_) {
    return invalid_argument("model: batch of {} tokens outside [1, {}] planned", T, max_tokens_);
  }
  if (l < -1 || l >= geo_.layers) return invalid_argument("model: layer {} out of range", l);
  if (x.dtype != DType::kF32 || !x.is_contiguous() || x.numel() != T * geo_.hidden) {
    return invalid_argument("model: activation {} is not a contiguous f32 [{}, {}]",
                            x.shape_string(), T, geo_.hidden);
  }
  return {};
}

Status ModelCompute::embed(const ConstTensorView& table, const PackedBatch& batch,
                           const TensorView& x0) {
  FERRY_TRY(check_layer_call(-1, batch, x0));
  const std::int64_t T = batch.ids.numel();
  return be_.embedding(
      {.out = reshaped(x0, {T, std::int64_t(geo_.hidden)}), .table = table, .ids = batch.ids},
      host());
}

Status ModelCompute::layer_forward(int l, const LayerTensors<ConstTensorView>& p,
                                   const PackedBatch& batch, const ConstTensorView& x_in,
                                   const TensorView& x_out) {
  FERRY_TRY(check_layer_call(l, batch, x_in));
  FERRY_TRY(check_layer_call(l, batch, x_out));
  return run_layer_forward(l, acts_[l % acts_.size()], p, batch.ids.numel(), batch,
                           x_in.as<float>(), x_out.as<float>());
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
                         host()));
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
  FERRY_TRY(be_.cross_entropy(
      {.nll = nll,
       .workspace = TensorView::contiguous(s.ce_workspace.data(), DType::kU8, Device::kCpu,
                                           {static_cast<std::int64_t>(s.ce_workspace.size())}),
       .hidden = f32_view(s.hf, {T, C}),
       .weight = lm_head,
       .targets = batch.targets,
       .chunk_tokens = kCeChunkTokens},
      host()));
  const auto* tg = batch.targets.as<std::int32_t>();
  for (std::int64_t t = 0; t < T; ++t) {
    if (tg[t] == -100) continue;
    res.loss_sum += s.nll[t];
    ++res.counted;
  }
  last_counted_ = res.counted;
  if (!nll_out.empty_view()) std::memcpy(nll_out.data, s.nll.data(), T * sizeof(float));
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
  FERRY_CHECK(static_cast<int>(acts_.size()) == geo_.layers,
              "model: whole-model forward on a ModelCompute created for the per-layer API");
  const std::int64_t C = geo_.hidden;
  FERRY_TRY(be_.embedding(
      {.out = f32_view(acts_[0].x_in, {T, C}), .table = params.embed, .ids = batch.ids}, host()));
  for (int l = 0; l < geo_.layers; ++l) {
    // The layer's output is the next layer's input (or the final norm's).
    std::vector<float>& x_out = (l + 1 < geo_.layers) ? acts_[l + 1].x_in : scratch_->x_final;
    FERRY_TRY(run_layer_forward(l, acts_[l], params.layers[l], T, batch, acts_[l].x_in.data(),
                                x_out.data()));
  }
  Scratch& s = *scratch_;
  FERRY_TRY(be_.rms_norm({.out = f32_view(s.hf, {T, C}),
                          .rstd = f32_view(s.rstd_f, {T}),
                          .in = f32_view(s.x_final, {T, C}),
                          .weight = params.final_norm,
                          .eps = geo_.rms_eps},
                         host()));
  if (!logits_out.empty_view()) {
    FERRY_TRY(be_.gemm(
        {.out = logits_out, .a = f32_view(s.hf, {T, C}), .b = params.lm_head, .trans_b = true},
        host()));
  }
  last_T_ = T;
  if (batch.targets.empty_view()) return ForwardResult{};
  return run_head_forward(params.lm_head, batch, nll_out);
}

}  // namespace ferry::model
