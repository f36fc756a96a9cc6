// SPDX-License-Identifier: Apache-2.0
// Pieces shared by the attention backward's dK/dV kernels (attention_bwd.cu: mma.sync;
// attention_bwd_wgmma.cu: sm_90a warpgroup MMAs): where dsum lives, P's rounding, and the
// launchers of the wgmma dK/dV and dQ kernels (the grids, slices and outputs of the mma.sync ones).
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_common.cuh"

namespace ferry::kernels::cuda::attn {

// Where rowsum(dO * O) of (token, head) lives: base + tok * tok_stride + head * head_stride (f32).
// Deterministic path: d_q's own row (tok_stride H D / 2, head_stride D / 2); atomic dQ: the
// workspace as [H, T] (tok_stride 1, head_stride T).
struct DsumRef {
  float* base;
  std::int64_t tok_stride, head_stride;
  __device__ __forceinline__ float* at(std::int64_t tok, std::int64_t h) const {
    return base + tok * tok_stride + h * head_stride;
  }
};

// P^T = exp2(s * scale log2 e - lse log2 e) with one rounding for every path (an explicit FMA).
__device__ __forceinline__ float bwd_prob(float s, float scale_log2, float lse) {
  return fast_exp2(fmaf(s, scale_log2, -(lse * kLog2e)));
}

// dK/dV for D = 64 / 128 with warpgroup MMAs (attention_bwd_wgmma.cu): the grid, slices, partials
// and bf16 outputs of attention_bwd_dkdv_kernel<D, BQ, false> (grid_kv x 128 threads), 64 query
// rows per work item. Deterministic (fixed order, no atomics).
cudaError_t launch_bwd_dkdv_wgmma(int d, bf16* d_k, bf16* d_v, float* partial, int slices,
                                  DsumRef dsum, const bf16* d_out, const bf16* q, const bf16* k,
                                  const bf16* v, const float* lse, const std::int32_t* cu,
                                  AttnShape sh, float scale_log2, dim3 grid, cudaStream_t stream);

// dQ for D = 64 / 128 with warpgroup MMAs: the grid (blocks of 64 query rows x H) and output
// of attention_bwd_dq_kernel<D, 64>; dsum read from where `dsum` says (d_q's own rows).
cudaError_t launch_bwd_dq_wgmma(int d, bf16* d_q, DsumRef dsum, const bf16* d_out, const bf16* q,
                                const bf16* k, const bf16* v, const float* lse,
                                const std::int32_t* cu, AttnShape sh, float scale_log2, dim3 grid,
                                cudaStream_t stream);

}  // namespace ferry::kernels::cuda::attn
