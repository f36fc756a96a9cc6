// SPDX-License-Identifier: Apache-2.0
// The analytic cost model: fills a PlanProblem from a model geometry (HF config), a machine
// description and the training shape, by counting FLOPs and bytes. It is a prediction, not a
// measurement: layer times are FLOPs / sustained rate (+ elementwise bytes / HBM rate), transfer
// times bytes / measured link rate. A measured profile (profile.h) overrides the times and rates
// when one exists for the machine and geometry.
//
// Defaults are the H200 machine of docs (architecture.md, measured 2026-11 with torch 2.11):
// pinned H2D 55.5 GB/s, D2H 55.3, duplex 101 (83 with the CPU streaming memory), bf16 GEMM at
// layer shapes ~700 TFLOP/s. Attention, HBM and CPU-optimizer rates are assumptions, marked so.
// Tests: tests/unit/plan/cost_model_test.cpp.
#pragma once

#include <string>

#include "core/result.h"
#include "model/config.h"
#include "plan/problem.h"

namespace ferry::plan {

struct MachineSpec {
  std::string name = "h200";
  double gemm_tflops = 700;      // bf16 GEMM at layer shapes (measured 690-785)
  double attn_fwd_tflops = 450;  // ASSUMED: flash-attention forward, causal, bf16
  double attn_bwd_tflops = 350;  // ASSUMED: its backward
  double hbm_gbps = 3000;        // ASSUMED: elementwise kernels' sustained HBM rate
  LinkRates link{55.5, 55.3, 101, 83, 6.5, 5.0};  // NVMe rates ASSUMED (Gen4 x4 class)
  double gpu_reserved_gb = 2.0;  // ASSUMED: CUDA context, cuBLAS workspace, allocator slack
  double cpu_optimizer_gparams_per_s = 2.0;  // ASSUMED: fused CPU AdamW, 16 AVX-512 threads
};

struct TrainShape {
  int batch_size = 1;
  int seq_len = 1024;
  double host_state_bytes_per_param = 16;  // bf16 weights + fp32 master + fp32 m, v + bf16 grads
  double grad_bytes_per_param = 2;         // gradients leave the GPU in bf16
  // Bytes per streamed weight and per boundary activation element: 2 (bf16, the design) or 4
  // (the stream executor today streams f32 weights and keeps f32 boundaries: bench_profile.h).
  double weight_bytes_per_param = 2;
  double activation_bytes = 2;
  int prefetch_depth = 2;      // layers of weights in flight ahead of compute
  int ce_chunk_tokens = 2048;  // tokens per fused lm_head + cross-entropy chunk
  int max_span = 4;            // R of the MILP
};

struct Capacities {
  double gpu_gb = 0;
  double host_gb = 0;
  double nvme_gb = 0;  // 0: no NVMe tier
};

// GPU bytes of layer `layer`'s kept internals at `tokens` tokens (LayerCost::internals_gb, in
// bytes): what the executor keeps per layer to skip the backward's re-forward, i.e.
// ModelCompute's f32 LayerActs (src/model/model_compute_buffers.h) of that layer — h1, rstd1,
// q_pre/k_pre and their rstds with a q/k norm, q, k, v, attn, lse, x_mid, h2, rstd2, and gate, up
// (dense; not the SwiGLU output act, which the executor recomputes in a kept layer's backward) or
// the MoE buffers (router logits and probs, top-k weights, ids, slots, offsets, gathered rows,
// expert gate/up/act and outputs); not x_in (the layer's input boundary, owned by the stream
// executor) — each buffer rounded up to the arena's 256-byte alignment. Dense, no q/k norm:
// 4 T (3C + 2Q + 2K + H + 2F + 2) bytes with every buffer a multiple of 256. Computed from
// the config, without a backend or ModelCompute; keep_internals_test.cpp checks it equals the
// executor's ModelCompute::kept_layer_bytes. NOTE(plan): that count could replace this one.
double kept_internals_bytes(const model::ModelConfig& c, int layer, double tokens);

// The backward's re-forward of a layer (the stream executor re-runs a not-kept layer's forward
// from its input just before the layer's backward) is "internals-only": it stops at what the
// backward reads. A dense layer skips its MLP down projection (2 N F C FLOPs) and the final
// residual add (the backward never reads the layer's output); an MoE layer skips only the expert
// combine and the residual add (the experts' down projections feed the router-weight gradient).
// Returns the FLOP share of that re-forward in the layer's full forward, in this file's FLOP
// convention: full = 2 x the FLOP-bearing weights per token (q/k/v/o, gate/up/down, biases
// included; MoE: router + top-k experts) + causal attention (QK^T and PV over half the S x S
// scores: 2 S H D per token at `seq_len` S). Dense: (full - 2 F C per token) / full, ~0.71 at
// Qwen2.5-3B and 7B shapes at S = 1024; MoE: 1 (the skipped combine and add are elementwise).
// Independent of the batch (every term is linear in it). A span recompute still runs full
// forwards (rec_ms): its outputs are the next layer's inputs.
double reforward_flop_share(const model::ModelConfig& c, int layer, int seq_len);

// Dense and MoE decoder layers (MoE: the top-k experts' FLOPs, all experts' bytes). The backward
// contains the internals-only re-forward, forward x reforward_flop_share (also the time a keep
// saves: keep_saved_ms); rec_ms (span recompute) is the full forward. Every layer's internals may
// be kept (internals_gb = kept_internals_bytes; keep_saved_ms leaves out the SwiGLU recompute of a
// kept dense layer: see the NOTE in cost_model.cpp).
Result<PlanProblem> analytic_problem(const model::ModelConfig& c, const MachineSpec& m,
                                     const TrainShape& shape, const Capacities& caps);

}  // namespace ferry::plan
