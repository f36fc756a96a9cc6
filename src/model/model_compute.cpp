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

Result<std::unique_ptr<ModelCompute>> ModelCompute::create(const DecoderGeometry& geo,
                                                           std::int64_t max_tokens,
                                                           kernels::Backend& backend) {
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
  if (backend.device() != Device::kCpu) {
    return unimplemented(
        "model: ModelCompute keeps activations in host memory; backend {} "
        "needs device buffers (not written yet)",
        backend.name());
  }
  std::unique_ptr<ModelCompute> mc(new ModelCompute(geo, max_tokens, backend));
  const std::int64_t T = max_tokens, C = geo.hidden, HD = std::int64_t(geo.heads) * geo.head_dim,
                     GD = std::int64_t(geo.kv_heads) * geo.head_dim, H = geo.heads,
                     G = geo.kv_heads, F = geo.mlp_width, Fe = geo.expert_width, E = geo.experts,
                     K = geo.top_k;
  mc->acts_.resize(geo.layers);
  for (int l = 0; l < geo.layers; ++l) {
    LayerActs& a = mc->acts_[l];
    a.x_in.resize(T * C);
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
    if (geo.layer_is_moe[l]) {
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
    } else {
      a.gate.resize(T * F);
      a.up.resize(T * F);
      a.act.resize(T * F);
    }
  }
  auto s = std::make_unique<Scratch>();
  s->x_final.resize(T * C);
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
  kernels::CrossEntropyArgs probe;
  probe.hidden = ConstTensorView::contiguous(nullptr, DType::kF32, Device::kCpu, {T, C});
  probe.weight = ConstTensorView::contiguous(nullptr, DType::kF32, Device::kCpu, {geo.vocab, C});
  probe.chunk_tokens = kCeChunkTokens;
  s->ce_workspace.resize(backend.workspace_bytes(probe));
  mc->scratch_ = std::move(s);
  return mc;
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

Status ModelCompute::attention_forward(int l, const LayerTensors<ConstTensorView>& p,
                                       std::int64_t T, const PackedBatch& batch) {
  LayerActs& a = acts_[l];
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
  return be_.add({.out = f32_view(a.x_mid, {T, C}), .a = f32_view(a.x_in, {T, C}), .b = tmp},
                 host());
}

Status ModelCompute::mlp_forward(int l, const LayerTensors<ConstTensorView>& p, std::int64_t T) {
  LayerActs& a = acts_[l];
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

Status ModelCompute::moe_forward(int l, const LayerTensors<ConstTensorView>& p, std::int64_t T) {
  LayerActs& a = acts_[l];
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

Status ModelCompute::layer_forward(int l, const LayerTensors<ConstTensorView>& p, std::int64_t T,
                                   const PackedBatch& batch) {
  LayerActs& a = acts_[l];
  const std::int64_t C = geo_.hidden;
  FERRY_TRY(be_.rms_norm({.out = f32_view(a.h1, {T, C}),
                          .rstd = f32_view(a.rstd1, {T}),
                          .in = f32_view(a.x_in, {T, C}),
                          .weight = p.attn_norm,
                          .eps = geo_.rms_eps},
                         host()));
  FERRY_TRY(attention_forward(l, p, T, batch));
  FERRY_TRY(be_.rms_norm({.out = f32_view(a.h2, {T, C}),
                          .rstd = f32_view(a.rstd2, {T}),
                          .in = f32_view(a.x_mid, {T, C}),
                          .weight = p.mlp_norm,
                          .eps = geo_.rms_eps},
                         host()));
  FERRY_TRY(geo_.layer_is_moe[l] ? moe_forward(l, p, T) : mlp_forward(l, p, T));
  // The layer's output is the next layer's input (or the final norm's).
  std::vector<float>& x_out = (l + 1 < geo_.layers) ? acts_[l + 1].x_in : scratch_->x_final;
  return be_.add({.out = f32_view(x_out, {T, C}),
                  .a = f32_view(a.x_mid, {T, C}),
                  .b = f32_view(scratch_->tmp_c, {T, C})},
                 host());
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
  const std::int64_t C = geo_.hidden;
  FERRY_TRY(be_.embedding(
      {.out = f32_view(acts_[0].x_in, {T, C}), .table = params.embed, .ids = batch.ids}, host()));
  for (int l = 0; l < geo_.layers; ++l) FERRY_TRY(layer_forward(l, params.layers[l], T, batch));
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
  ForwardResult res;
  if (batch.targets.empty_view()) return res;
  const TensorView nll = f32_view(s.nll, {T});
  FERRY_TRY(be_.cross_entropy(
      {.nll = nll,
       .workspace = TensorView::contiguous(s.ce_workspace.data(), DType::kU8, Device::kCpu,
                                           {static_cast<std::int64_t>(s.ce_workspace.size())}),
       .hidden = f32_view(s.hf, {T, C}),
       .weight = params.lm_head,
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

}  // namespace ferry::model
