// SPDX-License-Identifier: Apache-2.0
// The per-row part of the fused, chunked cross-entropy: given one chunk of f32 logits [n, V]
// (produced by a cuBLASLt GEMM into the caller's workspace), compute nll per row and, for the
// backward, d_logits = (softmax - onehot) * grad_scale in the GEMM input dtype. One block per row;
// the row is read three times (max, sum, write) and stays in L2 between passes. Deterministic
// (fixed-order block reductions). The GEMMs around it live in cuda_backend_ce.cpp.
// Tested in tests/gpu/kernels_ce_test.cpp.
#include "kernels/cuda/common.cuh"

namespace ferry::kernels::cuda {
namespace {

constexpr int kThreads = 512;

template <typename T>
__global__ void ce_rows_kernel(float* __restrict__ nll, T* __restrict__ d_logits,
                               const float* __restrict__ logits,
                               const std::int32_t* __restrict__ targets, std::int64_t v,
                               int ignore_index, float grad_scale) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const float* l = logits + row * v;
  const std::int32_t target = targets[row];
  const bool ignored = target == ignore_index || target < 0 || target >= v;
  float mx = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < v; i += blockDim.x) mx = fmaxf(mx, l[i]);
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (std::int64_t i = threadIdx.x; i < v; i += blockDim.x) sum += __expf(l[i] - mx);
  sum = block_sum(sum, scratch);
  const float lse = mx + logf(sum);
  if (threadIdx.x == 0) nll[row] = ignored ? 0.0f : lse - l[target];
  if (d_logits == nullptr) return;
  T* d = d_logits + row * v;
  if (ignored) {
    for (std::int64_t i = threadIdx.x; i < v; i += blockDim.x) d[i] = from_f32<T>(0.0f);
    return;
  }
  const float inv = 1.0f / sum;
  for (std::int64_t i = threadIdx.x; i < v; i += blockDim.x) {
    const float p = __expf(l[i] - mx) * inv;
    d[i] = from_f32<T>((p - (i == target ? 1.0f : 0.0f)) * grad_scale);
  }
}

}  // namespace

cudaError_t launch_ce_rows(float* nll, void* d_logits, Elt e, const float* logits,
                           const std::int32_t* targets, std::int64_t n, std::int64_t v,
                           int ignore_index, float grad_scale, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    ce_rows_kernel<T><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
        nll, static_cast<T*>(d_logits), logits, targets, v, ignore_index, grad_scale);
  });
}

}  // namespace ferry::kernels::cuda
