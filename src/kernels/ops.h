// SPDX-License-Identifier: Apache-2.0
// Argument structs for every Backend op: PODs of views plus scalars (FlashAttention's Params).
// Shape letters (docs/glossary.md): T tokens (packed, all sequences back to back), C hidden,
// H query heads, G kv heads, D head dim, F MLP width, E experts, K top-k, V vocab, S sequences.
// Unless a field says otherwise views are contiguous and row-major. "accumulates" means the op
// adds into the output (gradients of shared parameters); everything else overwrites.
// Optional views are left default-constructed (data == nullptr).
#pragma once

#include <cstdint>

#include "kernels/cpu/hybrid_adamw.h"
#include "tensor/tensor_view.h"

namespace ferry::kernels {

enum class OpKind : std::uint8_t {
  kGemm,
  kEmbedding,
  kEmbeddingBackward,
  kRmsNorm,
  kRmsNormBackward,
  kRope,
  kAttention,
  kAttentionBackward,
  kSwiGlu,
  kSwiGluBackward,
  kAdd,
  kRouter,
  kRouterBackward,
  kMoeDispatch,
  kMoeDispatchBackward,
  kMoeCombine,
  kMoeCombineBackward,
  kCrossEntropy,
  kAdamW,
  kSumSquares,
  kConvert,
};

// out = alpha * op(a) @ op(b) + beta * out (+ bias broadcast over rows when given).
// op(x) = x^T when trans_x. Linear layer y = x W^T: a = x [N, in], b = W [out, in], trans_b.
struct GemmArgs {
  TensorView out;        // [M, N]
  ConstTensorView a;     // [M, K] or [K, M] when trans_a
  ConstTensorView b;     // [K, N] or [N, K] when trans_b
  ConstTensorView bias;  // optional [N]
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

struct EmbeddingArgs {
  TensorView out;         // [T, C]
  ConstTensorView table;  // [V, C]
  ConstTensorView ids;    // [T] i32; each in [0, V) (checked: out-of-range -> Status)
};
struct EmbeddingBackwardArgs {
  TensorView d_table;     // [V, C], accumulates
  ConstTensorView d_out;  // [T, C]
  ConstTensorView ids;    // [T] i32
};

// out = in * rsqrt(mean(in^2) + eps) * weight, row by row. out16 (optional, f32 out only): out
// rounded to bf16 as well, bit for bit what Backend::convert(out) would give (round to nearest
// even), out and rstd unchanged by it: the bf16 GEMM operand of the q/k/v or gate/up projections
// written by the norm instead of a separate convert (ModelCompute's GEMM input reuse,
// model_compute_linear.cpp). SwiGluArgs::out16 is the same for the SwiGLU.
struct RmsNormArgs {
  TensorView out;          // [N, C]
  TensorView rstd;         // optional [N] f32: saved 1/rms for backward
  ConstTensorView in;      // [N, C]
  ConstTensorView weight;  // [C]
  float eps = 1e-6f;
  TensorView out16;  // [N, C] bf16, optional
};
struct RmsNormBackwardArgs {
  TensorView d_in;         // [N, C] (overwritten)
  TensorView d_weight;     // [C], accumulates
  ConstTensorView d_out;   // [N, C]
  ConstTensorView in;      // [N, C]
  ConstTensorView weight;  // [C]
  ConstTensorView rstd;    // [N] f32 from the forward
};

// Rotary embedding, Hugging Face "rotate_half" layout (pairs (i, i + R/2) over the first R dims of
// each head, R = rotary dims <= D), in place:
//   x'[i] = (x[i] cos - x[i+R/2] sin) * s,  x'[i+R/2] = (x[i+R/2] cos + x[i] sin) * s
// with angle = position * inv_freq[i] and s = attention_scaling. backward = true applies the
// transpose (angle negated), which is the gradient of the forward.
struct RopeArgs {
  TensorView x;               // [T, H, D], in place
  ConstTensorView positions;  // [T] i32
  ConstTensorView inv_freq;   // [R/2] f32 (rope_table.h computes it from the config's scaling)
  float attention_scaling = 1.0f;
  bool backward = false;
};

// Causal grouped-query attention over packed variable-length sequences: sequence s is tokens
// [cu_seqlens[s], cu_seqlens[s+1]); query head h reads kv head h / (H / G). No padding compute.
// Empty sequences are allowed. causal = false attends to the whole of the query's own sequence.
// The "f32" lse may be f64 on the reference backend (for f64 gradient checks). The CPU backend
// supports D <= 256 (unimplemented above).
struct AttentionArgs {
  TensorView out;              // [T, H, D]
  TensorView lse;              // optional [H, T] f32: log-sum-exp of scaled scores, for backward
  ConstTensorView q;           // [T, H, D]
  ConstTensorView k;           // [T, G, D]
  ConstTensorView v;           // [T, G, D]
  ConstTensorView cu_seqlens;  // [S + 1] i32, cu_seqlens[0] = 0, cu_seqlens[S] = T
  float scale = 0.0f;          // 0 -> 1/sqrt(D)
  bool causal = true;
};
struct AttentionBackwardArgs {
  TensorView d_q;              // [T, H, D] (overwritten)
  TensorView d_k;              // [T, G, D] (overwritten)
  TensorView d_v;              // [T, G, D] (overwritten)
  ConstTensorView d_out;       // [T, H, D]
  ConstTensorView q, k, v;     // as in the forward
  ConstTensorView out;         // [T, H, D] forward output
  ConstTensorView lse;         // [H, T] f32 forward log-sum-exp
  ConstTensorView cu_seqlens;  // [S + 1] i32
  float scale = 0.0f;
  bool causal = true;
  // Optional scratch (u8, up to Backend::workspace_bytes(args)): the CUDA backend uses it to
  // compute dK/dV for each query head of a group in parallel; empty = the low-memory path.
  TensorView workspace;
};

// out = silu(gate) * up. out16 (optional, f32 out only): out rounded to bf16 as well, bit for bit
// what Backend::convert(out) would give (round to nearest even): the bf16 GEMM operand of the
// next linear layer written by the producer instead of a separate convert (ModelCompute's GEMM
// input reuse, model_compute_linear.cpp).
struct SwiGluArgs {
  TensorView out;        // [N, F]
  ConstTensorView gate;  // [N, F]
  ConstTensorView up;    // [N, F]
  TensorView out16;      // [N, F] bf16, optional
};
struct SwiGluBackwardArgs {
  TensorView d_gate;      // [N, F]
  TensorView d_up;        // [N, F]
  ConstTensorView d_out;  // [N, F]
  ConstTensorView gate, up;
};

// out = a + b (elementwise, same shape; out may alias a or b).
struct AddArgs {
  TensorView out;
  ConstTensorView a, b;
};

// MoE router: probs = softmax(logits) over E; top-k by probability (ties: lower expert id first);
// weights = the top-k probs, renormalised to sum 1 when renormalize.
// Ranking is done on the logits (same order as the probs, since softmax is monotone, but immune to
// two distinct logits rounding to one prob). NaN / +inf logits, or a row of all -inf, are
// invalid_argument. The backward requires K distinct ids in [0, E) per row. "f32" views may be
// f64 on the reference backend.
struct RouterArgs {
  TensorView weights;      // [T, K] f32
  TensorView ids;          // [T, K] i32, in descending weight order
  TensorView probs;        // [T, E] f32 softmax, saved for backward
  ConstTensorView logits;  // [T, E]
  int top_k = 1;
  bool renormalize = false;
};
struct RouterBackwardArgs {
  TensorView d_logits;        // [T, E] (overwritten)
  ConstTensorView d_weights;  // [T, K] f32
  ConstTensorView probs;      // [T, E] f32
  ConstTensorView ids;        // [T, K] i32
  int top_k = 1;
  bool renormalize = false;
};

// Dispatch: sorts the T*K (token, k) assignments by expert (stable: by token, then k) and gathers
// the token rows. Expert e's rows are gathered[expert_offsets[e] .. expert_offsets[e+1]).
struct MoeDispatchArgs {
  TensorView gathered;        // [T*K, C]
  TensorView expert_offsets;  // [E + 1] i32
  TensorView slot_of;         // [T, K] i32: row of (t, k) in gathered
  ConstTensorView x;          // [T, C]
  ConstTensorView ids;        // [T, K] i32
  int num_experts = 0;
};
struct MoeDispatchBackwardArgs {
  TensorView d_x;              // [T, C], accumulates
  ConstTensorView d_gathered;  // [T*K, C]
  ConstTensorView slot_of;     // [T, K] i32
};
// Combine: out[t] = sum over k = 0..K-1, in that order, of weights[t,k] * expert_out[slot_of[t,k]].
// The fixed order makes the result independent of which experts ran where (byte identity).
// In f32 each step is one fused multiply-add: acc = fma(w[t,k], row[c], acc) from acc = +0
// (CPU: AVX2 vfmadd or std::fma; CUDA: __fmaf_rn), so all f32 backends agree bit for bit.
// The reference accumulates in f64.
struct MoeCombineArgs {
  TensorView out;              // [T, C]
  ConstTensorView expert_out;  // [T*K, C]
  ConstTensorView weights;     // [T, K] f32
  ConstTensorView slot_of;     // [T, K] i32
};
// slot_of must be a permutation of [0, T*K) (what dispatch writes); slots are range-checked, a
// repeated slot gives an unspecified d_expert_out on the CPU backend.
struct MoeCombineBackwardArgs {
  TensorView d_expert_out;     // [T*K, C] (overwritten)
  TensorView d_weights;        // [T, K] f32 (overwritten)
  ConstTensorView d_out;       // [T, C]
  ConstTensorView expert_out;  // [T*K, C]
  ConstTensorView weights;     // [T, K] f32
  ConstTensorView slot_of;     // [T, K] i32
};

// Fused lm_head + cross-entropy, chunked over tokens: logits for at most chunk_tokens rows exist
// at a time (in workspace), never [T, V]. Targets equal to ignore_index contribute 0 loss and 0
// gradient. nll[t] = logsumexp(logits[t]) - logits[t, target[t]] (0 when ignored).
// When d_hidden / d_weight are given, computes gradients of sum_t grad_scale * nll[t]
// (grad_scale = 1 / number of counted tokens gives the mean loss's gradient).
// workspace_bytes() is min(chunk_tokens, T) * V * (8 on the reference: f64 logits; 4 on the CPU).
// Targets outside [0, V) other than ignore_index are invalid_argument (checked before any write).
struct CrossEntropyArgs {
  TensorView nll;           // [T] f32 per-token negative log-likelihood
  TensorView d_hidden;      // optional [T, C] (overwritten)
  TensorView d_weight;      // optional [V, C], accumulates
  TensorView workspace;     // u8 [workspace_bytes(args)]
  ConstTensorView hidden;   // [T, C] final-norm output
  ConstTensorView weight;   // [V, C] lm_head (or tied embedding)
  ConstTensorView targets;  // [T] i32
  int ignore_index = -100;
  int chunk_tokens = 256;
  float grad_scale = 1.0f;
};

// AdamW with bias correction, decoupled weight decay and a gradient scale (global-norm clip):
//   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
//   p -= lr * (m / (1-b1^step) / (sqrt(v / (1-b2^step)) + eps) + weight_decay * p)
// Optionally writes the updated parameter as bf16 into param_bf16 (the streaming copy).
struct AdamWArgs {
  TensorView param;       // [N] f32 master weights
  TensorView m;           // [N] f32
  TensorView v;           // [N] f32
  TensorView param_bf16;  // optional [N] bf16
  ConstTensorView grad;   // [N] f32
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  float grad_scale = 1.0f;
  std::int64_t step = 1;  // 1-based
};

// out = in, element by element, converted between float dtypes: f32 -> bf16 rounds to nearest
// even (NaN stays NaN), bf16 -> f32 is exact; equal dtypes copy. Shapes may differ as long as the
// element counts agree (both views contiguous). Used to feed f32 activations to bf16-only kernels
// (CUDA attention) and back. The reference also accepts f64 on either side.
struct ConvertArgs {
  TensorView out;      // [N...] f32 or bf16
  ConstTensorView in;  // [N...] f32 or bf16, same element count
};

// out[0] = sum of squares of x, accumulated in f64 on CPU (f32 on GPU). Deterministic on every
// backend: the same x gives the same bits.
struct SumSquaresArgs {
  TensorView out;     // [1] f32
  ConstTensorView x;  // [N]
  // Optional scratch (u8, Backend::workspace_bytes(args)): the CUDA backend then reduces with a
  // grid of blocks, each summing a fixed slice, and the partials in a fixed order (a different
  // order than the one-block path, so bits differ between the two, never run to run); empty =
  // one block walks the whole vector.
  TensorView workspace;
};

// The hybrid AdamW update of one span of one parameter (kernels/cpu/hybrid_adamw.h has the math
// and the pointer rules): every (master, states) combination of the hybrid optimizer. The
// constants come from cpu::make_adamw_constants, computed by the caller exactly as the CPU
// LayerOptimizer does, so every backend sees the same f32 constants. Raw pointers, not views: the
// span holds up to nine optional arrays (which ones depends on master and states) and the
// kernels address 8-bit codes and block scales by element and block offsets.
// Every pointer lives on `device` (the backend's). With 8-bit states the span starts on a block
// boundary of its parameter: index0 % cpu::q8::kBlock == 0.
struct HybridAdamWArgs {
  Device device = Device::kCpu;  // where every pointer of `span` lives
  cpu::MasterKind master = cpu::MasterKind::kF32;
  cpu::StateKind states = cpu::StateKind::kF32;
  cpu::AdamWConstants k{};    // cpu::make_adamw_constants(lr, b1, b2, eps, wd, grad_scale, step)
  cpu::HybridAdamWSpan span;  // [span.n] elements, pointers as hybrid_adamw.h lists them
};

}  // namespace ferry::kernels
