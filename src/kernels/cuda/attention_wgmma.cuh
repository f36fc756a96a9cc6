// SPDX-License-Identifier: Apache-2.0
// What the attention kernels with sm_90a warpgroup MMAs share (attention_fwd_wgmma.cu,
// attention_bwd_wgmma.cu): the swizzled tile load, whether this build and device run them, and
// the forward's launcher (the backward's are in attention_bwd_common.cuh).
#pragma once

#include <cstdint>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ferry::kernels::cuda::attn {

// Rows [r0, r0 + rows) of one head of a packed [T, heads, D] tensor (sequence at s0, length len)
// into a 128-byte-swizzled [rows][D] tile (wgmma.cuh) through cp.async, rows at or past len
// zero-filled (the caller commits).
template <int D>
__device__ __forceinline__ void load_rows_swz(unsigned char* dst, const bf16* src, std::int64_t s0,
                                              std::int64_t r0, std::int64_t len, int rows,
                                              std::int64_t heads, std::int64_t head) {
  constexpr int kVecPerRow = D / 8;
  for (int i = threadIdx.x; i < rows * kVecPerRow; i += blockDim.x) {
    const int r = i / kVecPerRow, c = (i % kVecPerRow) * 8;
    const std::int64_t rr = r0 + r;
    const bool ok = rr < len;
    cp_async16(dst + wgmma::swz128_offset(r, c, rows),
               ok ? src + ((s0 + rr) * heads + head) * D + c : src, ok);
  }
}

// The first 1024-byte-aligned address of dynamic shared memory (swizzle atoms need it; the
// kernels ask for 1024 bytes of slack).
__device__ __forceinline__ unsigned char* align1024(unsigned char* smem) {
  const auto raw = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  return smem + ((1024u - (raw & 1023u)) & 1023u);
}

// Whether this build and the current device run the warpgroup-MMA kernels: built with sm_90a
// (FERRY_CUDA_SM90A) and a compute capability 9.0 device; false otherwise (the callers then run
// the mma.sync kernels). Defined in attention_bwd_wgmma.cu.
bool wgmma_available();

// The forward for D = 64 / 128 (attention_fwd_wgmma.cu); same inputs and outputs as
// launch_attention_fwd.
cudaError_t launch_fwd_wgmma(void* out, float* lse, const void* q, const void* k, const void* v,
                             const std::int32_t* cu, AttnShape sh, cudaStream_t stream);

}  // namespace ferry::kernels::cuda::attn
