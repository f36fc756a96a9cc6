// SPDX-License-Identifier: Apache-2.0
// Host-side declarations of every kernel launcher in kernels/cuda/*.cu. Included by the .cu files
// (which define them) and by cuda_backend*.cpp (which validates arguments and calls them), so it
// needs only cuda_runtime.h. Contract for every launcher: pointers are device pointers to
// contiguous row-major data, shapes were validated by the caller, work is enqueued on `stream`
// (last), nothing is allocated, and the return value is cudaGetLastError() after the launches.
// Elt says whether the "main" tensors of an op are f32 or bf16; f32-only fields are noted.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ferry::kernels::cuda {

enum class Elt : int { kF32 = 0, kBF16 = 1 };

// elementwise.cu ---------------------------------------------------------------------------------
// out = a + b, n elements (out may alias a or b).
cudaError_t launch_add(Elt e, void* out, const void* a, const void* b, std::int64_t n,
                       cudaStream_t stream);
// out = silu(gate) * up.
cudaError_t launch_swiglu(Elt e, void* out, const void* gate, const void* up, std::int64_t n,
                          cudaStream_t stream);
// The same over f32, also writing out16 (bf16) = out rounded to nearest even (launch_convert's
// rounding, bit for bit).
cudaError_t launch_swiglu_f32_bf16(float* out, void* out16, const float* gate, const float* up,
                                   std::int64_t n, cudaStream_t stream);
cudaError_t launch_swiglu_backward(Elt e, void* d_gate, void* d_up, const void* d_out,
                                   const void* gate, const void* up, std::int64_t n,
                                   cudaStream_t stream);
// All f32 except param_bf16 (optional, may be null).
struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay, grad_scale, bc1, bc2;  // bc = 1 - beta^step
};
cudaError_t launch_adamw(float* param, float* m, float* v, void* param_bf16, const float* grad,
                         std::int64_t n, AdamWParams p, cudaStream_t stream);
// Programmatic dependent launch (pdl.cuh launch_pdl): on unless FERRY_PDL=0, where the current
// device is of compute capability 9.0 or newer; read once per process (pdl.cpp).
bool pdl_enabled();
// f32 out[m, n] = alpha * a[m, k] @ b[n, k]^T (+ bias[n]) + beta * out, rows contiguous, for
// 1 <= m <= kSmallGemmMaxRows (gemm_small_m.cu): a decode step's linear layers, read at HBM speed;
// each row's bits are independent of m.
inline constexpr int kSmallGemmMaxRows = 4;
// The small-m kernels' inner loop: kPipelined issues several steps' weight loads before adding
// them, kOneStep one at a time (the loop before it); both add in the same order and give the same
// bits. kDefault: kPipelined unless FERRY_SMALL_M_PIPELINE=0 (read once per process).
enum class SmallMLoop { kDefault, kPipelined, kOneStep };
cudaError_t launch_small_m_gemm_f32(float* out, const float* a, const float* b, const float* bias,
                                    std::int64_t m, std::int64_t n, std::int64_t k,
                                    std::int64_t lda, std::int64_t ldb, std::int64_t ldo,
                                    float alpha, float beta, cudaStream_t stream,
                                    SmallMLoop loop = SmallMLoop::kDefault);
// The same with b [n, k] in bf16 (raw bits, widened exactly): the f32 kernel's bits on the widened
// weight (an f32 copy with the same ldb, 16-byte aligned when b is 8-byte aligned). The serving
// engine's bf16 dense weights (serve_kernels.h small_m_gemm_bf16w).
cudaError_t launch_small_m_gemm_bf16w(float* out, const float* a, const std::uint16_t* b,
                                      const float* bias, std::int64_t m, std::int64_t n,
                                      std::int64_t k, std::int64_t lda, std::int64_t ldb,
                                      std::int64_t ldo, float alpha, float beta,
                                      cudaStream_t stream, SmallMLoop loop = SmallMLoop::kDefault);
// Up to kSmallGemmMaxOutputs small-m GEMMs on the same a [m, k] (lda) in one launch (a decode
// step's q/k/v projections, or gate/up): out_o [m, ldo_o] = alpha * a @ b_o^T (+ bias_o) +
// beta * out_o, b_o [n_o, ldb_o] f32 (multi_f32) or bf16 bits (multi_bf16w). Each output element
// is computed by the single-output kernel's column code (gemm_small_m.cu), so every output gets
// exactly the bits of its own launch_small_m_gemm_{f32,bf16w}; where the outputs' weights would
// take different loops (alignment), each output is launched on its own.
inline constexpr int kSmallGemmMaxOutputs = 3;
struct SmallMGemmOutput {
  float* out = nullptr;         // [m, ldo]
  const void* b = nullptr;      // [n, ldb] f32 or bf16 bits
  const float* bias = nullptr;  // [n] or null
  std::int64_t n = 0, ldb = 0, ldo = 0;
};
cudaError_t launch_small_m_gemm_multi_f32(const SmallMGemmOutput* outs, int count, const float* a,
                                          std::int64_t m, std::int64_t k, std::int64_t lda,
                                          float alpha, float beta, cudaStream_t stream,
                                          SmallMLoop loop = SmallMLoop::kDefault);
cudaError_t launch_small_m_gemm_multi_bf16w(const SmallMGemmOutput* outs, int count, const float* a,
                                            std::int64_t m, std::int64_t k, std::int64_t lda,
                                            float alpha, float beta, cudaStream_t stream,
                                            SmallMLoop loop = SmallMLoop::kDefault);
// out[0] = sum x^2, f32 accumulation, deterministic. partials == nullptr: one block walks x.
// Else (kSumSquaresBlocks floats of scratch): a grid whose size depends only on n, each block
// summing one fixed slice into partials[b], then one block adds the partials in index order.
inline constexpr int kSumSquaresBlocks = 512;
cudaError_t launch_sum_squares(Elt e, float* out, const void* x, std::int64_t n, float* partials,
                               cudaStream_t stream);

// out [n] (Elt e_out) = in [n] (Elt e_in) converted; f32 -> bf16 rounds to nearest even.
cudaError_t launch_convert(Elt e_out, void* out, Elt e_in, const void* in, std::int64_t n,
                           cudaStream_t stream);

// rms_norm.cu ------------------------------------------------------------------------------------
// out, in: [n, c]; weight [c] (same Elt); rstd [n] f32, optional.
cudaError_t launch_rms_norm(Elt e, void* out, float* rstd, const void* in, const void* weight,
                            std::int64_t n, std::int64_t c, float eps, cudaStream_t stream);
// The same over f32, also writing out16 (bf16 [n, c]) = out rounded to nearest even
// (launch_convert's rounding, bit for bit); out and rstd are the bits launch_rms_norm gives.
cudaError_t launch_rms_norm_f32_bf16(float* out, void* out16, float* rstd, const float* in,
                                     const float* weight, std::int64_t n, std::int64_t c, float eps,
                                     cudaStream_t stream);
// x_out = x + y (f32, n x c; x_out may alias x), then out = rms_norm(x_out) with rstd, in one
// launch: the bits of launch_add followed by launch_rms_norm (f32) on every output (rms_norm.cu
// mirrors launch_rms_norm's kernel choice; y or x not 16-byte aligned: those two launches).
cudaError_t launch_add_rms_norm_f32(float* x_out, float* out, float* rstd, const float* x,
                                    const float* y, const float* weight, std::int64_t n,
                                    std::int64_t c, float eps, cudaStream_t stream);
// d_in overwritten, d_weight [c] accumulated (same Elt as in), deterministic.
cudaError_t launch_rms_norm_backward(Elt e, void* d_in, void* d_weight, const void* d_out,
                                     const void* in, const void* weight, const float* rstd,
                                     std::int64_t n, std::int64_t c, cudaStream_t stream);

// rope.cu ----------------------------------------------------------------------------------------
// x [t, h, d] in place; positions [t] i32; inv_freq [r/2] f32.
cudaError_t launch_rope(Elt e, void* x, const std::int32_t* positions, const float* inv_freq,
                        std::int64_t t, std::int64_t h, std::int64_t d, std::int64_t r,
                        float scaling, bool backward, cudaStream_t stream);

// Qwen3's per-head q/k norms and rope in one launch (f32): for q_in [t, h, d] -> q_out and
// k_in [t, g, d] -> k_out, each head row rms_norm'd with q_weight / k_weight [d] (rstd optional,
// [t*h] / [t*g]) and then rotated as launch_rope (r = 2 * inv_freq size <= d, forward): the bits of
// launch_rms_norm on [t*h, d] and [t*g, d] followed by launch_rope on q_out and k_out. Returns
// cudaErrorNotSupported (nothing launched) unless d % 4 == 0, d < 256 and the row pointers are
// 16-byte aligned (the rms_norm kernel this one mirrors); the caller then runs the four launches.
cudaError_t launch_qk_norm_rope_f32(float* q_out, float* q_rstd, const float* q_in,
                                    const float* q_weight, float* k_out, float* k_rstd,
                                    const float* k_in, const float* k_weight,
                                    const std::int32_t* positions, const float* inv_freq,
                                    std::int64_t t, std::int64_t h, std::int64_t g, std::int64_t d,
                                    std::int64_t r, float eps, float scaling, cudaStream_t stream);

// embedding.cu -----------------------------------------------------------------------------------
// out [t, c] = table[ids]; an id outside [0, v) gives a zero row (the host cannot check device ids
// without a sync; see docs/cuda.md). 16-byte vectors where the rows and bases allow;
// FERRY_EMBEDDING_FWD=element: the element kernel (the same bits).
cudaError_t launch_embedding(Elt e, void* out, const void* table, const std::int32_t* ids,
                             std::int64_t t, std::int64_t c, std::int64_t v, cudaStream_t stream);
// d_table [v, c] += scatter of d_out [t, c], f32 or bf16 d_table: each element adds its tokens'
// d_out in token order, rounding after each add (deterministic). Default: column x vocabulary
// slice threads; FERRY_EMBEDDING_BWD=column: one thread per column, =compact: the slice's tokens
// compacted per chunk and walked several rows at a time (the same bits, all three).
cudaError_t launch_embedding_backward(Elt e_table, void* d_table, Elt e_dout, const void* d_out,
                                      const std::int32_t* ids, std::int64_t t, std::int64_t c,
                                      std::int64_t v, cudaStream_t stream);

// router.cu --------------------------------------------------------------------------------------
cudaError_t launch_router(Elt e_logits, float* weights, std::int32_t* ids, float* probs,
                          const void* logits, std::int64_t t, std::int64_t e, int k,
                          bool renormalize, cudaStream_t stream);
cudaError_t launch_router_backward(Elt e_dlogits, void* d_logits, const float* d_weights,
                                   const float* probs, const std::int32_t* ids, std::int64_t t,
                                   std::int64_t e, int k, bool renormalize, cudaStream_t stream);

// moe.cu -----------------------------------------------------------------------------------------
cudaError_t launch_moe_dispatch(Elt e, void* gathered, std::int32_t* expert_offsets,
                                std::int32_t* slot_of, const void* x, const std::int32_t* ids,
                                std::int64_t t, std::int64_t k, std::int64_t c,
                                std::int64_t num_experts, cudaStream_t stream);
cudaError_t launch_moe_dispatch_backward(Elt e, void* d_x, const void* d_gathered,
                                         const std::int32_t* slot_of, std::int64_t t,
                                         std::int64_t k, std::int64_t c, cudaStream_t stream);
cudaError_t launch_moe_combine(Elt e, void* out, const void* expert_out, const float* weights,
                               const std::int32_t* slot_of, std::int64_t t, std::int64_t k,
                               std::int64_t c, cudaStream_t stream);
cudaError_t launch_moe_combine_backward(Elt e, void* d_expert_out, float* d_weights,
                                        const void* d_out, const void* expert_out,
                                        const float* weights, const std::int32_t* slot_of,
                                        std::int64_t t, std::int64_t k, std::int64_t c,
                                        cudaStream_t stream);

// cross_entropy.cu -------------------------------------------------------------------------------
// Per row of logits [n, v] (f32): nll[row] and, when d_logits != null, d_logits [n, v] (Elt e) =
// (softmax - onehot(target)) * grad_scale (rows with target == ignore_index: nll 0, grad 0).
cudaError_t launch_ce_rows(float* nll, void* d_logits, Elt e, const float* logits,
                           const std::int32_t* targets, std::int64_t n, std::int64_t v,
                           int ignore_index, float grad_scale, cudaStream_t stream);

// attention_fwd.cu / attention_bwd.cu ------------------------------------------------------------
struct AttnShape {
  std::int64_t t, h, g, d, s;  // tokens, q heads, kv heads, head dim, sequences
  float scale;
  bool causal;
};
// bf16 q/k/v/out; lse [h, t] f32 (may be null).
cudaError_t launch_attention_fwd(void* out, float* lse, const void* q, const void* k, const void* v,
                                 const std::int32_t* cu_seqlens, AttnShape sh, cudaStream_t stream);
// lse required; d_q/d_k/d_v overwritten; deterministic (no atomics) unless FERRY_ATTN_BWD_DQ=atomic
// (D = 64 / 128 with a workspace that holds dQ's f32 accumulator: dQ by atomics, attention_bwd.cu).
// workspace (f32, may be null): up to attention_bwd_workspace_floats() floats (which reads the same
// variable); more of it = more dK/dV parallelism.
cudaError_t launch_attention_bwd(void* d_q, void* d_k, void* d_v, const void* d_out, const void* q,
                                 const void* k, const void* v, const void* out, const float* lse,
                                 const std::int32_t* cu_seqlens, AttnShape sh, float* workspace,
                                 std::int64_t workspace_floats, cudaStream_t stream);
// Whether attention runs its warpgroup-MMA kernels here by default (an sm_90a build on a compute
// capability 9.0 device; FERRY_ATTN_FWD_WGMMA=0 / FERRY_ATTN_BWD_WGMMA=0 turn them off);
// elsewhere the mma.sync ones.
bool attention_wgmma_available();
// g: kv heads (no partials when g == h).
std::int64_t attention_bwd_workspace_floats(std::int64_t t, std::int64_t h, std::int64_t g,
                                            std::int64_t d);

}  // namespace ferry::kernels::cuda
