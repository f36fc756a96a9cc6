// SPDX-License-Identifier: Apache-2.0
// FLOP and byte counts per decoder layer. Shape letters: N = B*S tokens, C hidden, Q = H*D query
// width, K = Hkv*D key/value width, F MLP width (active experts' total for MoE), V vocab.
#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "model/model_summary.h"

namespace ferry::plan {

double kept_internals_bytes(const model::ModelConfig& c, int layer, double tokens) {
  const double T = tokens;
  const double C = static_cast<double>(c.hidden_size);
  const double H = static_cast<double>(c.num_attention_heads);
  const double G = static_cast<double>(c.num_key_value_heads);
  const double Q = static_cast<double>(c.q_dim()), K = static_cast<double>(c.kv_dim());
  double bytes = 0;
  // One LayerActs buffer of n 4-byte elements (f32, or i32 for the MoE ids), 256-byte aligned as
  // ArenaPlan::add places it.
  const auto buf = [&](double n) {
    if (n <= 0) return;
    bytes += std::ceil(n * 4 / 256) * 256;
  };
  // No x_in: a kept layer's input is its boundary, which the stream executor owns (ModelCompute
  // adds x_in to a layer's workspace only on the whole-model path).
  buf(T * C);  // h1
  buf(T);      // rstd1
  if (c.qk_norm != model::QkNorm::kNone) {
    const bool per_head = c.qk_norm == model::QkNorm::kPerHead;
    buf(T * Q);                 // q_pre
    buf(T * K);                 // k_pre
    buf(per_head ? T * H : T);  // q_rstd
    buf(per_head ? T * G : T);  // k_rstd
  }
  buf(T * Q);  // q
  buf(T * K);  // k
  buf(T * K);  // v
  buf(T * Q);  // attn
  buf(H * T);  // lse
  buf(T * C);  // x_mid
  buf(T * C);  // h2
  buf(T);      // rstd2
  if (c.is_moe_layer(layer)) {
    const double E = static_cast<double>(c.num_experts);
    const double k = static_cast<double>(c.num_experts_per_tok);
    const double Fe = static_cast<double>(c.moe_intermediate_size);
    buf(T * E);       // router_logits
    buf(T * E);       // probs
    buf(T * k);       // weights
    buf(T * k);       // ids (i32)
    buf(T * k);       // slot_of (i32)
    buf(E + 1);       // offsets (i32)
    buf(T * k * C);   // gathered
    buf(T * k * Fe);  // egate
    buf(T * k * Fe);  // eup
    buf(T * k * Fe);  // eact
    buf(T * k * C);   // eout
  } else {
    const double F = static_cast<double>(c.intermediate_size);
    buf(T * F);  // gate
    buf(T * F);  // up
    // Not act = swiglu(gate, up): a kept dense layer writes it into the shared workspace and its
    // backward recomputes it from gate and up (ModelCompute::swiglu_recomputes()).
  }
  return bytes;
}

namespace {

// FLOPs of one layer's forward at B sequences of S tokens.
struct LayerFlops {
  double gemm = 0;       // 2 N x (attention weights + active MLP weights, MoE: router + top-k)
  double attention = 0;  // causal QK^T and PV: 2 B S^2 H D
  double down = 0;       // the dense MLP down projection, part of gemm: 2 N F C (MoE: 0)
};

LayerFlops layer_flops(const model::ModelConfig& c, const model::LayerSummary& ls, double B,
                       double S) {
  const double N = B * S;
  double mlp_active = static_cast<double>(ls.mlp_params);
  if (ls.moe) {
    mlp_active -= static_cast<double>(c.num_experts - c.num_experts_per_tok) *
                  static_cast<double>(ls.expert_params);
  }
  LayerFlops f;
  f.gemm = 2 * N * (static_cast<double>(ls.attention_params) + mlp_active);
  // Causal attention: QK^T and PV over half the S x S scores, per head.
  f.attention = 2 * 2 * B * S * S * static_cast<double>(c.num_attention_heads) *
                static_cast<double>(c.head_dim) / 2;
  if (!ls.moe) {
    f.down = 2 * N * static_cast<double>(c.intermediate_size) * static_cast<double>(c.hidden_size);
  }
  return f;
}

// Share of the internals-only re-forward (reforward_flop_share).
double reforward_share(const LayerFlops& f) {
  const double full = f.gemm + f.attention;
  return full > 0 ? (full - f.down) / full : 1.0;
}

}  // namespace

double reforward_flop_share(const model::ModelConfig& c, int layer, int seq_len) {
  const model::ModelSummary sum = model::summarize(c, nullptr);
  return reforward_share(layer_flops(c, sum.layers.at(layer), 1, seq_len));
}

Result<PlanProblem> analytic_problem(const model::ModelConfig& c, const MachineSpec& m,
                                     const TrainShape& shape, const Capacities& caps) {
  if (shape.batch_size < 1 || shape.seq_len < 1) {
    return invalid_argument("plan: batch {} x seq {}: both must be >= 1", shape.batch_size,
                            shape.seq_len);
  }
  if (!(shape.weight_bytes_per_param > 0 && shape.activation_bytes > 0)) {
    return invalid_argument("plan: weight and activation bytes must be > 0");
  }
  if (!(m.gemm_tflops > 0 && m.attn_fwd_tflops > 0 && m.attn_bwd_tflops > 0 && m.hbm_gbps > 0 &&
        m.cpu_optimizer_gparams_per_s > 0)) {
    return invalid_argument("plan: machine {}: compute rates must be > 0", m.name);
  }
  const model::ModelSummary sum = model::summarize(c, nullptr);
  const int L = static_cast<int>(c.num_hidden_layers);
  const double N = static_cast<double>(shape.batch_size) * shape.seq_len;
  const double B = shape.batch_size, S = shape.seq_len;
  const double C = static_cast<double>(c.hidden_size);
  const double Q = static_cast<double>(c.q_dim()), K = static_cast<double>(c.kv_dim());
  const double V = static_cast<double>(c.vocab_size);
  constexpr double kGB = 1e9, kBf16 = 2;
  const double gemm = m.gemm_tflops * 1e12 / 1e3;  // FLOP per ms
  const double hbm = m.hbm_gbps * kGB / 1e3;       // bytes per ms

  PlanProblem p;
  p.num_layers = L;
  p.boundary_gb.assign(L + 1, N * C * shape.activation_bytes / kGB);
  p.layers.resize(L);
  double max_w = 0, max_g = 0;
  for (int j = 0; j < L; ++j) {
    const model::LayerSummary& ls = sum.layers[j];
    const double params = static_cast<double>(ls.attention_params + ls.mlp_params + ls.norm_params);
    double F = static_cast<double>(c.intermediate_size);
    if (ls.moe) F = static_cast<double>(c.num_experts_per_tok * c.moe_intermediate_size);
    const LayerFlops fl = layer_flops(c, ls, B, S);
    const double gemm_flops = fl.gemm;
    const double attn_flops = fl.attention;
    // Elementwise traffic (norms, rope, SwiGLU, residual adds), read + write, bf16.
    const double elem_bytes = N * (12 * C + 3 * F + 2 * (Q + K)) * kBf16;
    const double fwd =
        gemm_flops / gemm + attn_flops / (m.attn_fwd_tflops * 1e9) + elem_bytes / hbm;
    // The backward's internals-only re-forward (reforward_flop_share: a dense layer's forward
    // without its down projection and residual add), its FLOP share of the forward time. Applied
    // to the whole forward time (attention and elementwise included), as bench_profile.cpp
    // applies it to a measured forward, so the two profiles mean the same thing.
    const double reforward = fwd * reforward_share(fl);
    // Backward = internals-only re-forward + dgrad and wgrad GEMMs + attention backward.
    const double bwd = reforward + 2 * gemm_flops / gemm +
                       2.5 * attn_flops / (m.attn_bwd_tflops * 1e9) + 2 * elem_bytes / hbm;
    LayerCost& lc = p.layers[j];
    lc.fwd_ms = fwd;
    lc.rec_ms = fwd;
    lc.bwd_ms = bwd;
    lc.weight_gb = params * shape.weight_bytes_per_param / kGB;
    lc.grad_gb = params * shape.grad_bytes_per_param / kGB;
    // GPU-resident (PlanProblem::resident_layers): the layer's host model state plus the f32
    // gradient accumulator (an estimate; ferry plan with an executor target replaces it by the
    // executor's layout, cmd_plan_executor_fit.h).
    lc.resident_gb = params * (shape.host_state_bytes_per_param + 4) / kGB;
    // Forward: norm out, q, k, v, attention out, gate, up, activation (transient).
    lc.work_fwd_gb = N * (2 * C + 2 * Q + 2 * K + 3 * F) * kBf16 / kGB;
    // Backward: the re-forwarded internals kept for the layer's backward, plus the gradients in
    // flight (two of width F, two of C, and dY/dX at the boundaries).
    lc.work_bwd_gb = N * (7 * C + 2 * Q + 2 * K + 5 * F) * kBf16 / kGB;
    // Kept internals (the executor's f32 LayerActs): the backward then skips its re-forward, so a
    // keep saves the internals-only re-forward, not the full forward (rec_ms).
    // NOTE(plan): keep_saved_ms = the re-forward overstates the saving of a dense layer a little:
    // a kept layer's backward still recomputes the SwiGLU output (kept_internals_bytes), one
    // elementwise pass over [N, F], 3F bf16 values per token in this model's elementwise count
    // (reads gate and up, writes act): N * 3F * 2 / hbm, 0.62 ms of the 8.8 ms re-forward (12.4 ms
    // forward) at Qwen2.5-7B, batch 16 x 1024 (7 %; the executor's f32 pass moves 14 bytes per
    // element, ~1.1-1.5 ms at 3-4 TB/s). Kept as the re-forward so that the analytic and the
    // measured profiles (profile.cpp: reforward_ms, the measured forward x the share) mean the
    // same thing.
    lc.internals_gb = kept_internals_bytes(c, j, N) / kGB;
    lc.keep_saved_ms = reforward;
    max_w = std::max(max_w, lc.weight_gb);
    max_g = std::max(max_g, lc.grad_gb);
  }
  const double head_params = V * C + C;  // lm_head (tied or not: streamed the same) + final norm
  p.head_weight_gb = head_params * shape.weight_bytes_per_param / kGB;
  p.head_grad_gb = head_params * shape.grad_bytes_per_param / kGB;
  const double chunk = std::min<double>(N, shape.ce_chunk_tokens);
  // lm_head weights + fp32 gradient accumulator, one chunk's fp32 logits and bf16 dlogits, the
  // final norm output and dY of boundary L.
  p.loss_work_gb = (head_params * (kBf16 + 4) + chunk * V * (4 + kBf16) + 2 * N * C * kBf16) / kGB;
  p.loss_ms = 6 * N * V * C / gemm + N * V * (4 + kBf16) * 2 / hbm;

  // Serial per step: boundary 0 in and its gradient out (embedding gather/scatter on the host),
  // layer 0's weights in and gradients out, and the optimizer of layer 0 plus the embedding rows
  // the next batch touches (updated first so the gather reads current rows).
  const LinkRates& r = m.link;
  const double a0 = p.boundary_gb[0];
  const double w0 = p.layers[0].weight_gb, g0 = p.layers[0].grad_gb;
  const double opt_rate = m.cpu_optimizer_gparams_per_s * kGB / 1e3;  // params per ms
  const double layer0_params = w0 * kGB / shape.weight_bytes_per_param;
  const double rows_params = std::min(V, N) * C;
  p.step_fixed_ms = (a0 + w0) / r.h2d_gbps * 1e3 + (a0 + g0) / r.d2h_gbps * 1e3 +
                    (layer0_params + rows_params) / opt_rate;
  const double total_params = static_cast<double>(sum.total_params);
  p.cpu_optimizer_ms = total_params / opt_rate;
  p.link = r;

  p.gpu_cap_gb = caps.gpu_gb;
  p.host_cap_gb = caps.host_gb;
  p.nvme_cap_gb = caps.nvme_gb;
  p.gpu_fixed_gb = m.gpu_reserved_gb + (shape.prefetch_depth + 1) * max_w + 2 * max_g;
  p.host_fixed_gb = total_params * shape.host_state_bytes_per_param / kGB;
  p.max_span = shape.max_span;
  p.batch_size = shape.batch_size;
  p.seq_len = shape.seq_len;
  p.model_flops_per_step = 6 * static_cast<double>(sum.active_params) * N;
  p.source = "analytic:" + m.name;
  FERRY_TRY(validate(p));
  return p;
}

}  // namespace ferry::plan
