// SPDX-License-Identifier: Apache-2.0
// FLOPs of a training step, two ways (docs/train.md "Throughput figures"):
//
//   model     6 * N * tokens: the anchors' convention (MegaTrain / LazyTrain report TFLOPS this
//             way), N = parameters a token passes through (all of them in a dense model; in a
//             MoE the shared ones + top_k experts), tokens = every computed position (padding
//             included, as the anchors count B * S).
//   hardware  the multiply-adds the executor really ran: each layer forward it executed (first
//             pass, recompute, internals re-run before backward) at 2 * matmul params per token
//             plus causal attention over each packed sequence's real length, each layer backward
//             at 4 * matmul params per token plus 2.5x the attention forward (flash backward
//             recomputes the scores), and the lm_head forward + backward (embedding lookups and
//             elementwise work are not counted).
//
// MFU = model FLOPs / step time / the accelerator's peak dense bf16 FLOP/s (given, or known from
// the device name); hardware TFLOPS above the model figure is the price of recompute.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "model/model_compute.h"

namespace ferry::train {

// Per-token multiply-add counts of one geometry (each x2 is FLOPs).
struct TokenMatmulParams {
  std::vector<double> layer;  // [L]: q, k, v, o + dense MLP or router + top_k experts
  // [L]: the part of layer[l] an internals-only re-forward skips (ModelCompute::
  // layer_forward_internals): a dense layer's down projection F * C; 0 for MoE layers.
  std::vector<double> layer_output;
  double head = 0;          // lm_head V * C
  double model_params = 0;  // N of the 6 N convention (embedding, norms and biases included)
};
TokenMatmulParams token_matmul_params(const model::DecoderGeometry& g);

// Causal attention forward FLOPs of one layer over packed sequences (cu_seqlens [S + 1]):
// QK^T and PV, 4 * D * H per (query, key) pair with key <= query.
double attention_forward_flops(const model::DecoderGeometry& g,
                               std::span<const std::int32_t> cu_seqlens);

// One micro-batch's FLOPs. layer_forwards / layer_backwards: how many layer passes the executor
// ran for it (the in-memory executor: L and L; the stream executor adds its recomputes). Layers
// are priced at the mean of token_matmul_params().layer (exact unless a model mixes dense and MoE
// layers and recomputes some more often than others). internals_forwards: how many of the
// layer_forwards were internals-only re-forwards (priced without layer_output).
struct StepFlops {
  double model = 0;     // 6 N tokens
  double hardware = 0;  // what ran
  StepFlops& operator+=(const StepFlops& o) {
    model += o.model;
    hardware += o.hardware;
    return *this;
  }
};
StepFlops micro_batch_flops(const model::DecoderGeometry& g, const TokenMatmulParams& t,
                            std::span<const std::int32_t> cu_seqlens, std::uint64_t layer_forwards,
                            std::uint64_t layer_backwards, std::uint64_t internals_forwards = 0);

// Peak dense bf16 tensor FLOP/s of a device by its name (H100/H200 SXM, A100, L40S, RTX 3090 /
// 4090, ...), 0 when unknown. From the vendors' data sheets (dense, no sparsity).
double known_peak_bf16_flops(std::string_view device_name);

}  // namespace ferry::train
