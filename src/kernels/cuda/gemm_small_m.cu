// SPDX-License-Identifier: Apache-2.0
// f32 GEMM for a handful of rows against a row-major weight (a linear layer in a decode step):
//   out[r, j] = alpha * sum_q a[r, q] * b[j, q] (+ bias[j]) + beta * out[r, j],   r < m <= 4.
// One warp per output column j reads b's row j once for all m rows (float4 loads when k, the
// row strides and the pointers allow), each lane summing a fixed k-stride, then the fixed xor
// tree of warp_sum: a row's result depends only on that row and b, never on how many rows share
// the launch (a decode step of 1 or 3 sequences gives each sequence the same bits).
// Why: cuBLASLt's choices for m = 1 on the serve decode shapes ran at 0.45-2.3 TB/s (ncu on the
// H200, session 10: 9 us for a 2048 x 512 f32 weight, 14 us for 2048 x 4096), where reading the
// weight once at HBM speed takes 1-11 us. Tested in tests/gpu/kernels_dense_test.cpp against
// the f64 reference with style.md's rule, and for row independence.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace ferry::kernels::cuda {
namespace {

constexpr int kWarps = 8;

template <int M, bool kVec>
__global__ void __launch_bounds__(kWarps * 32)
    small_m_gemm_kernel(float* __restrict__ out, const float* __restrict__ a,
                        const float* __restrict__ b, const float* __restrict__ bias, std::int64_t n,
                        std::int64_t k, std::int64_t lda, std::int64_t ldb, std::int64_t ldo,
                        float alpha, float beta) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (j >= n) return;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
  const float* w = b + j * ldb;
  if constexpr (kVec) {
    const std::int64_t k4 = k / 4;
    const float4* w4 = reinterpret_cast<const float4*>(w);
    for (std::int64_t q = lane; q < k4; q += 32) {
      const float4 wv = w4[q];
#pragma unroll
      for (int r = 0; r < M; ++r) {
        const float4 xv = reinterpret_cast<const float4*>(a + r * lda)[q];
        acc[r] += wv.x * xv.x;
        acc[r] += wv.y * xv.y;
        acc[r] += wv.z * xv.z;
        acc[r] += wv.w * xv.w;
      }
    }
  } else {
    for (std::int64_t q = lane; q < k; q += 32) {
      const float wq = w[q];
#pragma unroll
      for (int r = 0; r < M; ++r) acc[r] += wq * a[r * lda + q];
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = warp_sum(acc[r]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      float v = alpha * acc[r];
      if (bias != nullptr) v += bias[j];
      if (beta != 0.0f) v += beta * out[r * ldo + j];
      out[r * ldo + j] = v;
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

template <int M>
void launch_m(float* out, const float* a, const float* b, const float* bias, std::int64_t n,
              std::int64_t k, std::int64_t lda, std::int64_t ldb, std::int64_t ldo, float alpha,
              float beta, cudaStream_t stream) {
  const auto grid = static_cast<unsigned>((n + kWarps - 1) / kWarps);
  const bool vec = k % 4 == 0 && lda % 4 == 0 && ldb % 4 == 0 && aligned16(a) && aligned16(b);
  if (vec) {
    small_m_gemm_kernel<M, true>
        <<<grid, kWarps * 32, 0, stream>>>(out, a, b, bias, n, k, lda, ldb, ldo, alpha, beta);
  } else {
    small_m_gemm_kernel<M, false>
        <<<grid, kWarps * 32, 0, stream>>>(out, a, b, bias, n, k, lda, ldb, ldo, alpha, beta);
  }
}

}  // namespace

cudaError_t launch_small_m_gemm_f32(float* out, const float* a, const float* b, const float* bias,
                                    std::int64_t m, std::int64_t n, std::int64_t k,
                                    std::int64_t lda, std::int64_t ldb, std::int64_t ldo,
                                    float alpha, float beta, cudaStream_t stream) {
  if (m < 1 || m > kSmallGemmMaxRows || n < 0 || k < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  switch (m) {
    case 1:
      launch_m<1>(out, a, b, bias, n, k, lda, ldb, ldo, alpha, beta, stream);
      break;
    case 2:
      launch_m<2>(out, a, b, bias, n, k, lda, ldb, ldo, alpha, beta, stream);
      break;
    case 3:
      launch_m<3>(out, a, b, bias, n, k, lda, ldb, ldo, alpha, beta, stream);
      break;
    default:
      launch_m<4>(out, a, b, bias, n, k, lda, ldb, ldo, alpha, beta, stream);
      break;
  }
  return cudaGetLastError();
}

}  // namespace ferry::kernels::cuda
