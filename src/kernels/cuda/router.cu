// SPDX-License-Identifier: Apache-2.0
// MoE router: softmax over E experts, top-k (ties: lower expert id first), optional
// renormalisation, and its backward. One warp per token; top-k is K rounds of a warp argmax that
// skips experts already chosen. Deterministic. Tested in tests/gpu/kernels_moe_test.cpp.
#include "kernels/cuda/common.cuh"

namespace ferry::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxK = 32;

__device__ __forceinline__ bool better(float p, int id, float bp, int bid) {
  return p > bp || (p == bp && id < bid);
}

template <typename T>
__global__ void router_kernel(float* __restrict__ weights, std::int32_t* __restrict__ ids,
                              float* __restrict__ probs, const T* __restrict__ logits,
                              std::int64_t t, std::int64_t e, int k, bool renormalize) {
  const int lane = threadIdx.x & 31;
  const std::int64_t tok =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (tok >= t) return;
  const T* l = logits + tok * e;
  float* p = probs + tok * e;
  float mx = -INFINITY;
  for (std::int64_t i = lane; i < e; i += 32) mx = fmaxf(mx, to_f32(l[i]));
  mx = warp_max(mx);
  float sum = 0.0f;
  for (std::int64_t i = lane; i < e; i += 32) sum += __expf(to_f32(l[i]) - mx);
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (std::int64_t i = lane; i < e; i += 32) p[i] = __expf(to_f32(l[i]) - mx) * inv;
  __syncwarp();
  int chosen[kMaxK];
  float chosen_p[kMaxK];
  float total = 0.0f;
  for (int j = 0; j < k; ++j) {
    float bp = -1.0f;
    int bid = 0x7fffffff;
    for (std::int64_t i = lane; i < e; i += 32) {
      bool taken = false;
      for (int q = 0; q < j; ++q) taken |= (chosen[q] == static_cast<int>(i));
      const float pi = p[i];
      if (!taken && better(pi, static_cast<int>(i), bp, bid)) {
        bp = pi;
        bid = static_cast<int>(i);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, o);
      const int oid = __shfl_xor_sync(0xffffffffu, bid, o);
      if (better(op, oid, bp, bid)) {
        bp = op;
        bid = oid;
      }
    }
    chosen[j] = bid;
    chosen_p[j] = bp;
    total += bp;
  }
  if (lane == 0) {
    for (int j = 0; j < k; ++j) {
      ids[tok * k + j] = chosen[j];
      weights[tok * k + j] = renormalize ? chosen_p[j] / total : chosen_p[j];
    }
  }
}

template <typename T>
__global__ void router_backward_kernel(T* __restrict__ d_logits, const float* __restrict__ d_w,
                                       const float* __restrict__ probs,
                                       const std::int32_t* __restrict__ ids, std::int64_t t,
                                       std::int64_t e, int k, bool renormalize) {
  const int lane = threadIdx.x & 31;
  const std::int64_t tok =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (tok >= t) return;
  const float* p = probs + tok * e;
  const std::int32_t* id = ids + tok * k;
  const float* dw = d_w + tok * k;
  // Gradient w.r.t. the selected probabilities.
  float s = 0.0f, sdw = 0.0f;
  for (int j = 0; j < k; ++j) {
    const float pj = p[id[j]];
    s += pj;
    sdw += dw[j] * pj;
  }
  float dot = 0.0f;  // sum_j gp_j p_j
  for (int j = 0; j < k; ++j) {
    const float gp = renormalize ? dw[j] / s - sdw / (s * s) : dw[j];
    dot += gp * p[id[j]];
  }
  for (std::int64_t i = lane; i < e; i += 32) {
    float gp = 0.0f;
    for (int j = 0; j < k; ++j)
      if (id[j] == static_cast<std::int32_t>(i))
        gp = renormalize ? dw[j] / s - sdw / (s * s) : dw[j];
    d_logits[tok * e + i] = from_f32<T>(p[i] * (gp - dot));
  }
}

}  // namespace

cudaError_t launch_router(Elt e_logits, float* weights, std::int32_t* ids, float* probs,
                          const void* logits, std::int64_t t, std::int64_t e, int k,
                          bool renormalize, cudaStream_t stream) {
  if (t == 0) return cudaSuccess;
  if (k < 1 || k > kMaxK || k > e) return cudaErrorInvalidValue;
  const unsigned blocks = static_cast<unsigned>((t + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return dispatch_elt(e_logits, [&](auto tag) {
    using T = decltype(tag);
    router_kernel<T><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
        weights, ids, probs, static_cast<const T*>(logits), t, e, k, renormalize);
  });
}

cudaError_t launch_router_backward(Elt e_dlogits, void* d_logits, const float* d_weights,
                                   const float* probs, const std::int32_t* ids, std::int64_t t,
                                   std::int64_t e, int k, bool renormalize, cudaStream_t stream) {
  if (t == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((t + kWarpsPerBlock - 1) / kWarpsPerBlock);
  return dispatch_elt(e_dlogits, [&](auto tag) {
    using T = decltype(tag);
    router_backward_kernel<T><<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(
        static_cast<T*>(d_logits), d_weights, probs, ids, t, e, k, renormalize);
  });
}

}  // namespace ferry::kernels::cuda
