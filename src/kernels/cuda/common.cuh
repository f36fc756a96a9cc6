// SPDX-License-Identifier: Apache-2.0
// Device-side helpers shared by every kernels/cuda/*.cu file: element load/store in f32 or bf16
// (bf16 storage, f32 math everywhere), warp/block reductions, and the launcher-side element-type
// switch. Launchers return cudaError_t; cuda_backend.cpp turns it into a Status (cuda_util.h).
// No fmt/spdlog here so that nvcc only sees CUDA and the standard library.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launchers.h"

namespace ferry::kernels::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum/max in a fixed order (deterministic). `scratch` holds >= 32 floats; every thread
// of the block must call it; all threads get the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

inline unsigned grid_for(std::int64_t n, int threads, std::int64_t cap = 65535LL * 32) {
  std::int64_t g = (n + threads - 1) / threads;
  if (g < 1) g = 1;
  if (g > cap) g = cap;
  return static_cast<unsigned>(g);
}

// The one runtime -> compile-time switch over storage types. `f` is called with a value whose
// type is the element type. Unknown element types are reported, never guessed.
template <typename F>
cudaError_t dispatch_elt(Elt e, F&& f) {
  switch (e) {
    case Elt::kF32:
      f(float{});
      return cudaGetLastError();
    case Elt::kBF16:
      f(bf16{});
      return cudaGetLastError();
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace ferry::kernels::cuda
