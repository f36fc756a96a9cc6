// SPDX-License-Identifier: Apache-2.0
// Pieces shared by the attention backward's dK/dV kernels (attention_bwd.cu: mma.sync;
// attention_bwd_wgmma.cu: sm_90a warpgroup MMAs): where dsum lives, P / dS and the dK/dV store
// of a work item, and the launchers of the wgmma dK/dV and dQ kernels (the grids, slices and
// outputs of the mma.sync ones).
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

// P^T and dS^T of one work item in place, in C fragments of this warp's 16 keys x BQ queries
// (st: S^T in, P^T out; dpt: dP^T in, dS^T out; lse_s, dsum_s: the item's BQ rows from q0; kr:
// this lane's two keys). Only an item that meets a query or key tail or the causal diagonal of
// the warp's keys (from key_lo) needs the per-element mask; the others skip it (warp-uniform; the
// same values). Shared by the mma.sync and the warpgroup-MMA dK/dV kernels.
template <int BQ>
__device__ __forceinline__ void p_and_ds(float (&st)[BQ / 8][4], float (&dpt)[BQ / 8][4],
                                         const float* lse_s, const float* dsum_s, std::int64_t q0,
                                         std::int64_t key_lo, const std::int64_t (&kr)[2],
                                         std::int64_t len, bool causal, float scale_log2) {
  const int t = threadIdx.x & 3;
  const bool unmasked = q0 + BQ <= len && key_lo + 16 <= len && (!causal || q0 >= key_lo + 15);
  if (unmasked) {
#pragma unroll
    for (int nt = 0; nt < BQ / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ql = nt * 8 + 2 * t + (e & 1);
        const float p = bwd_prob(st[nt][e], scale_log2, lse_s[ql]);
        st[nt][e] = p;
        dpt[nt][e] = p * (dpt[nt][e] - dsum_s[ql]);  // dS^T
      }
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < BQ / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ql = nt * 8 + 2 * t + (e & 1);
        const std::int64_t qi = q0 + ql;
        const bool ok = qi < len && kr[e >> 1] < len && (!causal || qi >= kr[e >> 1]);
        const float p = ok ? bwd_prob(st[nt][e], scale_log2, lse_s[ql]) : 0.0f;
        st[nt][e] = p;
        dpt[nt][e] = p * (dpt[nt][e] - dsum_s[ql]);  // dS^T
      }
    }
  }
}

// A dK/dV kernel's result for this lane's two keys kr (rows below len) of kv head kvh: with
// partial, f32 partial sums of slice `slice` (of `slices`) for the reduction; else dK (times
// the softmax scale) and dV in bf16. dk / dv: C fragments over the head dim.
template <int D>
__device__ __forceinline__ void store_dkdv(const float (&dk)[D / 8][4], const float (&dv)[D / 8][4],
                                           const std::int64_t (&kr)[2], std::int64_t s0,
                                           std::int64_t len, std::int64_t kvh, int slice,
                                           int slices, float* __restrict__ partial,
                                           bf16* __restrict__ d_k, bf16* __restrict__ d_v,
                                           const AttnShape& sh) {
  const int t = threadIdx.x & 3;
  const float scale = sh.scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (kr[r] >= len) continue;
    const std::int64_t row = (s0 + kr[r]) * sh.g + kvh;
    if (partial != nullptr) {
      float* pk = partial + (static_cast<std::int64_t>(slice) * sh.t * sh.g + row) * D + 2 * t;
      float* pv = pk + static_cast<std::int64_t>(slices) * sh.t * sh.g * D;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        *reinterpret_cast<float2*>(pk + nd * 8) = make_float2(dk[nd][2 * r], dk[nd][2 * r + 1]);
        *reinterpret_cast<float2*>(pv + nd * 8) = make_float2(dv[nd][2 * r], dv[nd][2 * r + 1]);
      }
      continue;
    }
    bf16* dkp = d_k + row * D + 2 * t;
    bf16* dvp = d_v + row * D + 2 * t;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      *reinterpret_cast<std::uint32_t*>(dkp + nd * 8) =
          pack_bf16(dk[nd][2 * r] * scale, dk[nd][2 * r + 1] * scale);
      *reinterpret_cast<std::uint32_t*>(dvp + nd * 8) = pack_bf16(dv[nd][2 * r], dv[nd][2 * r + 1]);
    }
  }
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
