// SPDX-License-Identifier: Apache-2.0
// The serving engine's bf16 dense weights (--dense-dtype bf16, docs/serve.md "bf16 dense
// weights"): the two kernels besides the small-m GEMM (gemm_small_m.cu) that let the f32 engine
// read a bf16 weight without changing a bit of its arithmetic:
//   embedding_bf16  out[t, :] = widen(table[ids[t], :]): the f32 embedding of the widened table
//                   (an id outside [0, v) writes zeros, as embedding.cu);
//   widen_bf16      out[i] = widen(in[i]): a bf16 weight into an f32 workspace, which the f32
//                   GEMM (cuBLASLt) then reads as if the weight had been stored in f32.
// Widening bf16 -> f32 is exact (the bits shifted up 16), so both equal the f32 path on the
// rounded weights bit for bit. Tested in tests/gpu/serve_dense_bf16_gpu_test.cpp.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/serve_launchers.h"

namespace ferry::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float widen(std::uint16_t w) {
  return __uint_as_float(static_cast<unsigned>(w) << 16);
}

__global__ void embedding_bf16_kernel(float* __restrict__ out,
                                      const std::uint16_t* __restrict__ table,
                                      const std::int32_t* __restrict__ ids, std::int64_t c,
                                      std::int64_t v) {
  pdl_wait();
  pdl_trigger();
  const std::int64_t tok = blockIdx.x;
  const std::int32_t id = ids[tok];
  float* dst = out + tok * c;
  if (id < 0 || id >= v) {
    for (std::int64_t i = threadIdx.x; i < c; i += blockDim.x) dst[i] = 0.0f;
    return;
  }
  const std::uint16_t* src = table + static_cast<std::int64_t>(id) * c;
  for (std::int64_t i = threadIdx.x; i < c; i += blockDim.x) dst[i] = widen(src[i]);
}

__global__ void widen_bf16_kernel(float* __restrict__ out, const std::uint16_t* __restrict__ in,
                                  std::int64_t n) {
  pdl_wait();
  pdl_trigger();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = widen(in[i]);
  }
}

}  // namespace

cudaError_t launch_embedding_bf16(float* out, const std::uint16_t* table, const std::int32_t* ids,
                                  std::int64_t t, std::int64_t c, std::int64_t v,
                                  cudaStream_t stream) {
  if (t == 0) return cudaSuccess;
  launch_pdl(embedding_bf16_kernel, static_cast<unsigned>(t), kThreads, 0, stream, out, table, ids,
             c, v);
  return cudaGetLastError();
}

cudaError_t launch_widen_bf16(float* out, const std::uint16_t* in, std::int64_t n,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // Grid-stride over at most 132 SMs x 16 blocks (the H200's 132 SMs; more only waits).
  const std::int64_t blocks = std::min<std::int64_t>((n + kThreads - 1) / kThreads, 132 * 16);
  launch_pdl(widen_bf16_kernel, static_cast<unsigned>(blocks), kThreads, 0, stream, out, in, n);
  return cudaGetLastError();
}

}  // namespace ferry::kernels::cuda
