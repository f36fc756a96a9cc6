// SPDX-License-Identifier: Apache-2.0
// ModelCompute::backward: the forward pass of model_compute.cpp run in reverse, consuming the
// activations it kept. Gradients are ADDED into the caller's ModelGrads (so tied embeddings and
// gradient accumulation work without special cases). Each step names the forward line it undoes.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "model/model_compute.h"
#include "model/model_compute_buffers.h"

namespace ferry::model {

using detail::bf16_view;
using detail::f32_view;
using detail::i32_view;
using detail::rows_of;
using kernels::Stream;

Status ModelCompute::mlp_backward(int l, LayerActs& a, const LayerTensors<ConstTensorView>& p,
                                  const LayerTensors<TensorView>& g, std::int64_t T) {
  Scratch& s = *scratch_;
  const std::int64_t C = geo_.hidden, F = geo_.mlp_width;
  const ConstTensorView dy = f32_view(s.dx, {T, C});
  // y = act Wd^T: act is read only here, as the weight gradient's operand. Right after this
  // layer's forward act is where the forward left it, and its bf16 copy may still be in gemm.x16.
  // A kept layer's act lives in the shared workspace's buffer (create()), so when another dense
  // layer wrote that since, act = silu(gate) * up is recomputed from the kept gate and up by the
  // forward's own call: the same kernel over the same inputs, the same bits (with the reuse on
  // and bf16 GEMMs it writes the bf16 operand into gemm.x16 too, as in the forward).
  const TensorView act = f32_view(a.act, {T, F});
  ActHolder& holder = act_holder_[static_cast<std::size_t>(l % work_layers_)];
  GemmInput act_in;
  if (holder != ActHolder{l, &a, T}) {
    FERRY_ASSIGN_OR_RETURN(
        act_in, swiglu_into_gemm_input(act, f32_view(a.gate, {T, F}), f32_view(a.up, {T, F})));
    holder = {l, &a, T};
    ++swiglu_recomputes_;
  } else {
    act_in = reusable_act16(l, a, act);
  }
  FERRY_TRY(linear_backward(f32_view(s.d_act, {T, F}), g.down, {}, dy, act_in, p.down, false));
  // act = silu(gate) * up
  FERRY_TRY(be_.swiglu_backward({.d_gate = f32_view(s.d_gate, {T, F}),
                                 .d_up = f32_view(s.d_up, {T, F}),
                                 .d_out = f32_view(s.d_act, {T, F}),
                                 .gate = f32_view(a.gate, {T, F}),
                                 .up = f32_view(a.up, {T, F})},
                                st()));
  // gate = h2 Wg^T, up = h2 Wu^T  ->  dh = d_gate Wg + d_up Wu
  // One rounding of h2 for both weight gradients (reuse on).
  FERRY_ASSIGN_OR_RETURN(const GemmInput h2_in, shared_gemm_input(f32_view(a.h2, {T, C})));
  FERRY_TRY(linear_backward(f32_view(s.dh, {T, C}), g.gate, {}, f32_view(s.d_gate, {T, F}), h2_in,
                            p.gate, false));
  return linear_backward(f32_view(s.dh, {T, C}), g.up, {}, f32_view(s.d_up, {T, F}), h2_in, p.up,
                         true);
}

Status ModelCompute::moe_backward(LayerActs& a, const LayerTensors<ConstTensorView>& p,
                                  const LayerTensors<TensorView>& g, std::int64_t T) {
  Scratch& s = *scratch_;
  const std::int64_t C = geo_.hidden, E = geo_.experts, K = geo_.top_k, Fe = geo_.expert_width;
  // y = combine(eout, weights)
  FERRY_TRY(be_.moe_combine_backward({.d_expert_out = f32_view(s.d_eout, {T * K, C}),
                                      .d_weights = f32_view(s.d_weights, {T, K}),
                                      .d_out = f32_view(s.dx, {T, C}),
                                      .expert_out = f32_view(a.eout, {T * K, C}),
                                      .weights = f32_view(a.weights, {T, K}),
                                      .slot_of = i32_view(a.slot_of, {T, K})},
                                     st()));
  const TensorView d_eout = f32_view(s.d_eout, {T * K, C}),
                   d_eact = f32_view(s.d_eact, {T * K, Fe}),
                   d_egate = f32_view(s.d_egate, {T * K, Fe}),
                   d_eup = f32_view(s.d_eup, {T * K, Fe}),
                   d_gathered = f32_view(s.d_gathered, {T * K, C});
  const TensorView gathered = f32_view(a.gathered, {T * K, C}),
                   egate = f32_view(a.egate, {T * K, Fe}), eup = f32_view(a.eup, {T * K, Fe}),
                   eact = f32_view(a.eact, {T * K, Fe});
  // The forward's expert row ranges (read back to the host there when on a device).
  const std::int32_t* offsets = dev_ == Device::kCpu ? a.offsets.ptr : a.h_offsets.data();
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int64_t r0 = offsets[e], r1 = offsets[e + 1];
    if (r1 == r0) continue;
    // eout_e = eact_e Wd_e^T
    FERRY_TRY(linear_backward(rows_of(d_eact, r0, r1), g.expert_down[e], {},
                              rows_of(ConstTensorView(d_eout), r0, r1),
                              rows_of(ConstTensorView(eact), r0, r1), p.expert_down[e], false));
    FERRY_TRY(be_.swiglu_backward({.d_gate = rows_of(d_egate, r0, r1),
                                   .d_up = rows_of(d_eup, r0, r1),
                                   .d_out = rows_of(ConstTensorView(d_eact), r0, r1),
                                   .gate = rows_of(ConstTensorView(egate), r0, r1),
                                   .up = rows_of(ConstTensorView(eup), r0, r1)},
                                  st()));
    const ConstTensorView x_e = rows_of(ConstTensorView(gathered), r0, r1);
    FERRY_ASSIGN_OR_RETURN(const GemmInput x_in, shared_gemm_input(x_e));
    FERRY_TRY(linear_backward(rows_of(d_gathered, r0, r1), g.expert_gate[e], {},
                              rows_of(ConstTensorView(d_egate), r0, r1), x_in, p.expert_gate[e],
                              false));
    FERRY_TRY(linear_backward(rows_of(d_gathered, r0, r1), g.expert_up[e], {},
                              rows_of(ConstTensorView(d_eup), r0, r1), x_in, p.expert_up[e], true));
  }
  // gathered = dispatch(h2)  ->  dh accumulates every copy of a token's row
  const TensorView dh = f32_view(s.dh, {T, C});
  FERRY_TRY(zero_fill(s.dh.ptr, T * C));
  FERRY_TRY(be_.moe_dispatch_backward(
      {.d_x = dh, .d_gathered = d_gathered, .slot_of = i32_view(a.slot_of, {T, K})}, st()));
  // weights, ids = router(h2 Wr^T)
  FERRY_TRY(be_.router_backward({.d_logits = f32_view(s.d_router_logits, {T, E}),
                                 .d_weights = f32_view(s.d_weights, {T, K}),
                                 .probs = f32_view(a.probs, {T, E}),
                                 .ids = i32_view(a.ids, {T, K}),
                                 .top_k = geo_.top_k,
                                 .renormalize = geo_.renormalize_topk},
                                st()));
  // f32 operands in every precision (model_compute_linear.cpp: the router).
  return linear_backward(dh, g.router, {}, f32_view(s.d_router_logits, {T, E}),
                         f32_view(a.h2, {T, C}), p.router, true, /*f32_operands=*/true);
}

TensorView ModelCompute::attention_workspace(const kernels::AttentionBackwardArgs& args) const {
  const detail::DevBuf<std::uint8_t>& w = scratch_->attn_workspace;
  if (w.n == 0) return {};
  const auto want = static_cast<std::int64_t>(be_.workspace_bytes(args));
  if (want == 0) return {};
  FERRY_CHECK(want <= w.n, "model: attention backward wants {} workspace bytes, {} planned", want,
              w.n);
  // Sized for max_tokens, so every T <= max_tokens gets all it asks for: the same dK/dV split
  // (hence the same bits) whatever the batch size.
  return detail::typed_view(w, DType::kU8, {want});
}

Status ModelCompute::attention_backward(int l, LayerActs& a, const LayerTensors<ConstTensorView>& p,
                                        const LayerTensors<TensorView>& g, std::int64_t T,
                                        const PackedBatch& batch) {
  Scratch& s = *scratch_;
  const std::int64_t C = geo_.hidden, H = geo_.heads, G = geo_.kv_heads, D = geo_.head_dim;
  // x_mid = x_in + attn Wo^T
  FERRY_TRY(linear_backward(f32_view(s.d_attn, {T, H * D}), g.o, g.o_bias,
                            f32_view(s.dx_mid, {T, C}), f32_view(a.attn, {T, H * D}), p.o, false));
  // attn = attention(q, k, v)
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Both paths pass the workspace when one was planned (attention_workspace()).
  if (!attn_bf16_) {
    kernels::AttentionBackwardArgs args{.d_q = f32_view(s.dq, {T, H, D}),
                                        .d_k = f32_view(s.dk, {T, G, D}),
                                        .d_v = f32_view(s.dv, {T, G, D}),
                                        .d_out = f32_view(s.d_attn, {T, H, D}),
                                        .q = f32_view(a.q, {T, H, D}),
                                        .k = f32_view(a.k, {T, G, D}),
                                        .v = f32_view(a.v, {T, G, D}),
                                        .out = f32_view(a.attn, {T, H, D}),
                                        .lse = f32_view(a.lse, {H, T}),
                                        .cu_seqlens = batch.cu_seqlens,
                                        .scale = scale};
    args.workspace = attention_workspace(args);
    FERRY_TRY(be_.attention_backward(args, st()));
  } else {
    // bf16-only attention: q/k/v/out in bf16 as the forward used them, dO cast down, dQ/dK/dV
    // back up. The forward's bf16 copies are still in q16/k16/v16/o16 when this layer was the
    // last one forwarded at this T (train/stream recomputes each layer just before its
    // backward); otherwise the saved f32 activations are recast: the same bf16 values, since the
    // rounding is deterministic and attn holds the bf16 output exactly.
    const std::int64_t nq = T * H * D, nk = T * G * D;
    if (attn16_layer_ != l || attn16_tokens_ != T || attn16_acts_ != &a) {
      attn16_layer_ = -1;  // until all four hold layer l's values
      for (auto [out, in, n] : {std::tuple{&s.q16, &a.q, nq},
                                {&s.k16, &a.k, nk},
                                {&s.v16, &a.v, nk},
                                {&s.o16, &a.attn, nq}}) {
        FERRY_TRY(be_.convert({.out = bf16_view(*out, {n}), .in = f32_view(*in, {n})}, st()));
      }
      attn16_layer_ = l;
      attn16_tokens_ = T;
      attn16_acts_ = &a;
    }
    FERRY_TRY(be_.convert({.out = bf16_view(s.do16, {nq}), .in = f32_view(s.d_attn, {nq})}, st()));
    kernels::AttentionBackwardArgs args{.d_q = bf16_view(s.dq16, {T, H, D}),
                                        .d_k = bf16_view(s.dk16, {T, G, D}),
                                        .d_v = bf16_view(s.dv16, {T, G, D}),
                                        .d_out = bf16_view(s.do16, {T, H, D}),
                                        .q = bf16_view(s.q16, {T, H, D}),
                                        .k = bf16_view(s.k16, {T, G, D}),
                                        .v = bf16_view(s.v16, {T, G, D}),
                                        .out = bf16_view(s.o16, {T, H, D}),
                                        .lse = f32_view(a.lse, {H, T}),
                                        .cu_seqlens = batch.cu_seqlens,
                                        .scale = scale};
    args.workspace = attention_workspace(args);
    FERRY_TRY(be_.attention_backward(args, st()));
    for (auto [out, in, n] :
         {std::tuple{&s.dq, &s.dq16, nq}, {&s.dk, &s.dk16, nk}, {&s.dv, &s.dv16, nk}}) {
      FERRY_TRY(be_.convert({.out = f32_view(*out, {n}), .in = bf16_view(*in, {n})}, st()));
    }
  }
  // rope(q), rope(k): the transpose rotation
  const ConstTensorView inv_freq = f32_view(scratch_->inv_freq, {scratch_->inv_freq.n});
  FERRY_TRY(be_.rope({.x = f32_view(s.dq, {T, H, D}),
                      .positions = batch.positions,
                      .inv_freq = inv_freq,
                      .attention_scaling = geo_.rope.attention_scaling,
                      .backward = true},
                     st()));
  FERRY_TRY(be_.rope({.x = f32_view(s.dk, {T, G, D}),
                      .positions = batch.positions,
                      .inv_freq = inv_freq,
                      .attention_scaling = geo_.rope.attention_scaling,
                      .backward = true},
                     st()));
  // q/k norm
  F32Buf* dq_proj = &s.dq;
  F32Buf* dk_proj = &s.dk;
  if (geo_.qk_norm != QkNorm::kNone) {
    const bool per_head = geo_.qk_norm == QkNorm::kPerHead;
    const std::int64_t qr = per_head ? T * H : T, qc = per_head ? D : H * D;
    const std::int64_t kr = per_head ? T * G : T, kc = per_head ? D : G * D;
    FERRY_TRY(be_.rms_norm_backward({.d_in = f32_view(s.dq_pre, {qr, qc}),
                                     .d_weight = g.q_norm,
                                     .d_out = f32_view(s.dq, {qr, qc}),
                                     .in = f32_view(a.q_pre, {qr, qc}),
                                     .weight = p.q_norm,
                                     .rstd = f32_view(a.q_rstd, {qr})},
                                    st()));
    FERRY_TRY(be_.rms_norm_backward({.d_in = f32_view(s.dk_pre, {kr, kc}),
                                     .d_weight = g.k_norm,
                                     .d_out = f32_view(s.dk, {kr, kc}),
                                     .in = f32_view(a.k_pre, {kr, kc}),
                                     .weight = p.k_norm,
                                     .rstd = f32_view(a.k_rstd, {kr})},
                                    st()));
    dq_proj = &s.dq_pre;
    dk_proj = &s.dk_pre;
  }
  // q, k, v = h1 W^T + b  ->  dh = dq Wq + dk Wk + dv Wv
  const TensorView dh = f32_view(s.dh, {T, C});
  // One rounding of h1 for the three weight gradients (reuse on).
  FERRY_ASSIGN_OR_RETURN(const GemmInput h1_in, shared_gemm_input(f32_view(a.h1, {T, C})));
  FERRY_TRY(linear_backward(dh, g.q, g.q_bias, f32_view(*dq_proj, {T, H * D}), h1_in, p.q, false));
  FERRY_TRY(linear_backward(dh, g.k, g.k_bias, f32_view(*dk_proj, {T, G * D}), h1_in, p.k, true));
  return linear_backward(dh, g.v, g.v_bias, f32_view(s.dv, {T, G * D}), h1_in, p.v, true);
}

// On entry s.dx holds d loss / d (layer output); on exit d loss / d (layer input).
Status ModelCompute::run_layer_backward(int l, LayerActs& a, const LayerTensors<ConstTensorView>& p,
                                        const LayerTensors<TensorView>& g, std::int64_t T,
                                        const PackedBatch& batch, const float* x_in) {
  Scratch& s = *scratch_;
  const std::int64_t C = geo_.hidden;
  // x_out = x_mid + mlp(h2): dh = d mlp input
  FERRY_TRY(geo_.layer_is_moe[l] ? moe_backward(a, p, g, T) : mlp_backward(l, a, p, g, T));
  // h2 = rms_norm(x_mid): dx_mid = dx + norm_backward(dh)
  const TensorView tmp = f32_view(s.tmp_c, {T, C});
  FERRY_TRY(be_.rms_norm_backward({.d_in = tmp,
                                   .d_weight = g.mlp_norm,
                                   .d_out = f32_view(s.dh, {T, C}),
                                   .in = f32_view(a.x_mid, {T, C}),
                                   .weight = p.mlp_norm,
                                   .rstd = f32_view(a.rstd2, {T})},
                                  st()));
  FERRY_TRY(
      be_.add({.out = f32_view(s.dx_mid, {T, C}), .a = f32_view(s.dx, {T, C}), .b = tmp}, st()));
  FERRY_TRY(attention_backward(l, a, p, g, T, batch));
  // h1 = rms_norm(x_in): dx = dx_mid + norm_backward(dh)
  FERRY_TRY(
      be_.rms_norm_backward({.d_in = tmp,
                             .d_weight = g.attn_norm,
                             .d_out = f32_view(s.dh, {T, C}),
                             .in = ConstTensorView::contiguous(x_in, DType::kF32, dev_, {T, C}),
                             .weight = p.attn_norm,
                             .rstd = f32_view(a.rstd1, {T})},
                            st()));
  return be_.add({.out = f32_view(s.dx, {T, C}), .a = f32_view(s.dx_mid, {T, C}), .b = tmp}, st());
}

// loss = mean nll over counted targets; logits = hf lm_head^T; hf = rms_norm(x_final).
// Leaves d loss / d x_final in s.dx.
Status ModelCompute::run_head_backward(const ConstTensorView& final_norm,
                                       const ConstTensorView& lm_head,
                                       const TensorView& d_final_norm, const TensorView& d_lm_head,
                                       const PackedBatch& batch, const float* x_final) {
  Scratch& s = *scratch_;
  const std::int64_t T = batch.ids.numel(), C = geo_.hidden;
  // The same rounded operands as the forward's (recast: the rounding is deterministic).
  FERRY_ASSIGN_OR_RETURN(const ConstTensorView hidden,
                         gemm_operand(f32_view(s.hf, {T, C}), s.hf16, s.hf16_f));
  FERRY_ASSIGN_OR_RETURN(const ConstTensorView weight, gemm_operand(lm_head, s.head16, s.head16_f));
  FERRY_TRY(be_.cross_entropy(
      {.nll = f32_view(s.nll, {T}),
       .d_hidden = f32_view(s.dh, {T, C}),
       .d_weight = d_lm_head,
       .workspace = detail::typed_view(s.ce_workspace, DType::kU8, {s.ce_workspace.n}),
       .hidden = hidden,
       .weight = weight,
       .targets = batch.targets,
       .chunk_tokens = detail::ce_chunk_tokens(geo_.vocab, dev_),
       .grad_scale = 1.0f / static_cast<float>(last_counted_)},
      st()));
  return be_.rms_norm_backward(
      {.d_in = f32_view(s.dx, {T, C}),
       .d_weight = d_final_norm,
       .d_out = f32_view(s.dh, {T, C}),
       .in = ConstTensorView::contiguous(x_final, DType::kF32, dev_, {T, C}),
       .weight = final_norm,
       .rstd = f32_view(s.rstd_f, {T})},
      st());
}

// x_in[0] = embed(ids). Like torch's Embedding(padding_idx=...), the padding row's gradient gets
// no contribution from the lookup (the tied lm_head's contribution still counts).
Status ModelCompute::run_embed_backward(const TensorView& d_table, const PackedBatch& batch) {
  Scratch& s = *scratch_;
  const std::int64_t T = batch.ids.numel(), C = geo_.hidden;
  if (geo_.padding_idx >= 0) {
    FERRY_ASSIGN_OR_RETURN(const std::int32_t* id,
                           read_to_host(batch.ids.as<std::int32_t>(), s.h_ids, T));
    for (std::int64_t t = 0; t < T; ++t) {
      if (id[t] == geo_.padding_idx) FERRY_TRY(zero_fill(s.dx.ptr + t * C, C));
    }
  }
  return be_.embedding_backward(
      {.d_table = d_table, .d_out = f32_view(s.dx, {T, C}), .ids = batch.ids}, st());
}

Status ModelCompute::head_backward(const ConstTensorView& final_norm,
                                   const ConstTensorView& lm_head, const TensorView& d_final_norm,
                                   const TensorView& d_lm_head, const PackedBatch& batch,
                                   const ConstTensorView& x_final) {
  FERRY_TRY(check_layer_call(-1, batch, x_final));
  if (batch.ids.numel() != last_T_) {
    return invalid_argument("model: head_backward over {} tokens after a forward over {}",
                            batch.ids.numel(), last_T_);
  }
  if (last_counted_ == 0) return {};  // every target ignored: the loss has no gradient
  return run_head_backward(final_norm, lm_head, d_final_norm, d_lm_head, batch,
                           x_final.as<float>());
}

Status ModelCompute::layer_backward(int l, const LayerTensors<ConstTensorView>& p,
                                    const LayerTensors<TensorView>& g, const PackedBatch& batch,
                                    const ConstTensorView& x_in) {
  FERRY_TRY(check_layer_call(l, batch, x_in));
  if (last_counted_ == 0) return {};
  return run_layer_backward(l, acts_[static_cast<std::size_t>(workspace_of(l))], p, g,
                            batch.ids.numel(), batch, x_in.as<float>());
}

Status ModelCompute::embed_backward(const TensorView& d_table, const PackedBatch& batch) {
  if (last_counted_ == 0) return {};
  return run_embed_backward(d_table, batch);
}

Status ModelCompute::backward(const ModelParams& params, const PackedBatch& batch,
                              const ModelGrads& grads) {
  const std::int64_t T = batch.ids.numel();
  if (T != last_T_) {
    return invalid_argument("model: backward over {} tokens after a forward over {}", T, last_T_);
  }
  if (batch.targets.empty_view()) return invalid_argument("model: backward needs targets");
  if (static_cast<int>(grads.layers.size()) != geo_.layers) {
    return invalid_argument("model: {} layer gradient sets for {} layers", grads.layers.size(),
                            geo_.layers);
  }
  FERRY_CHECK(work_layers_ == geo_.layers,
              "model: whole-model backward on a ModelCompute created for the per-layer API");
  if (last_counted_ == 0) return {};  // every target ignored: the loss has no gradient
  FERRY_TRY(run_head_backward(params.final_norm, params.lm_head, grads.final_norm, grads.lm_head,
                              batch, scratch_->x_final.ptr));
  for (int l = geo_.layers - 1; l >= 0; --l) {
    FERRY_TRY(run_layer_backward(l, acts_[l], params.layers[l], grads.layers[l], T, batch,
                                 acts_[l].x_in.ptr));
  }
  return run_embed_backward(grads.embed, batch);
}

}  // namespace ferry::model
