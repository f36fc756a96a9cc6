// SPDX-License-Identifier: Apache-2.0
// Grid-stride fill and verify kernels over raw device bytes. The verify kernel reduces per warp
// (shuffle) and issues one atomicAdd per warp that saw a mismatch, so a clean buffer costs no
// atomics. Reference: the host loops in device_pattern.cpp (same pattern_byte()).
#include <cuda_runtime.h>

#include "mem/cuda/device_pattern.cuh"
#include "mem/pattern_byte.h"

namespace ferry::mem::cuda {

namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;

unsigned grid_for(std::size_t bytes) {
  const std::size_t blocks = (bytes + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__global__ void fill_pattern_grid_stride(std::uint8_t* d_dst, std::size_t bytes,
                                         std::uint32_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes;
       i += stride) {
    d_dst[i] = pattern_byte(seed, i);
  }
}

__global__ void count_mismatches_grid_stride(const std::uint8_t* d_src, std::size_t bytes,
                                             std::uint32_t seed, unsigned long long* d_count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned long long n = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes;
       i += stride) {
    n += d_src[i] != pattern_byte(seed, i);
  }
  for (int offset = 16; offset > 0; offset /= 2) n += __shfl_down_sync(0xffffffffu, n, offset);
  if ((threadIdx.x & 31) == 0 && n != 0) atomicAdd(d_count, n);
}

}  // namespace

cudaError_t launch_fill_pattern(std::uint8_t* d_dst, std::size_t bytes, std::uint32_t seed,
                                cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  fill_pattern_grid_stride<<<grid_for(bytes), kThreads, 0, stream>>>(d_dst, bytes, seed);
  return cudaGetLastError();
}

cudaError_t launch_count_pattern_mismatches(const std::uint8_t* d_src, std::size_t bytes,
                                            std::uint32_t seed, unsigned long long* d_count,
                                            cudaStream_t stream) {
  if (const cudaError_t e = cudaMemsetAsync(d_count, 0, sizeof(*d_count), stream);
      e != cudaSuccess) {
    return e;
  }
  if (bytes == 0) return cudaSuccess;
  count_mismatches_grid_stride<<<grid_for(bytes), kThreads, 0, stream>>>(d_src, bytes, seed,
                                                                         d_count);
  return cudaGetLastError();
}

}  // namespace ferry::mem::cuda
