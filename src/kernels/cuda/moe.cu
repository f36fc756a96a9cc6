// SPDX-License-Identifier: Apache-2.0
// MoE dispatch (stable sort of the T*K assignments by expert + row gather), combine (weighted sum
// in routing order k = 0..K-1) and their backwards. Everything here is deterministic: the sort
// ranks come from ordered block scans (one block per expert walks the assignments in order), not
// from atomics, and every output row is written by exactly one block.
// Assignments whose expert id is outside [0, E) get slot_of = -1 and no row (ids are device data;
// see docs/cuda.md). Tested in tests/gpu/kernels_moe_test.cpp.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ferry::kernels::cuda {
namespace {

constexpr int kScanThreads = 256;

// counts[e] = number of assignments routed to expert e, written to offsets[e + 1].
__global__ void moe_count_kernel(std::int32_t* __restrict__ offsets,
                                 const std::int32_t* __restrict__ ids, std::int64_t n) {
  __shared__ float scratch[32];
  const int e = blockIdx.x;
  float cnt = 0.0f;  // exact in f32 up to 2^24 per thread-sum; n per thread is far below that
  int icnt = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) icnt += (ids[i] == e);
  cnt = static_cast<float>(icnt);
  cnt = block_sum(cnt, scratch);
  if (threadIdx.x == 0) offsets[e + 1] = static_cast<std::int32_t>(cnt + 0.5f);
}

// offsets[0] = 0; offsets[e+1] += offsets[e] (serial: E is at most a few hundred).
__global__ void moe_scan_kernel(std::int32_t* offsets, std::int64_t num_experts) {
  if (threadIdx.x != 0) return;
  offsets[0] = 0;
  for (std::int64_t e = 0; e < num_experts; ++e) offsets[e + 1] += offsets[e];
}

// slot_of[i] = offsets[e] + (number of earlier assignments with expert e), for ids[i] == e.
__global__ void moe_rank_kernel(std::int32_t* __restrict__ slot_of,
                                const std::int32_t* __restrict__ offsets,
                                const std::int32_t* __restrict__ ids, std::int64_t n) {
  __shared__ int warp_tot[kScanThreads / 32];
  const int e = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int running = offsets[e];
  for (std::int64_t base = 0; base < n; base += blockDim.x) {
    const std::int64_t i = base + threadIdx.x;
    const bool hit = i < n && ids[i] == e;
    const unsigned ballot = __ballot_sync(0xffffffffu, hit);
    const int before_in_warp = __popc(ballot & ((1u << lane) - 1u));
    if (lane == 0) warp_tot[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < kScanThreads / 32; ++w) {
      if (w < warp) before += warp_tot[w];
      total += warp_tot[w];
    }
    if (hit) slot_of[i] = running + before + before_in_warp;
    running += total;
    __syncthreads();
  }
}

template <typename T>
__global__ void moe_gather_kernel(T* __restrict__ gathered, std::int32_t* __restrict__ slot_of,
                                  const T* __restrict__ x, const std::int32_t* __restrict__ ids,
                                  std::int64_t k, std::int64_t c, std::int64_t num_experts) {
  const std::int64_t i = blockIdx.x;  // assignment (t, k) flattened
  const std::int32_t e = ids[i];
  if (e < 0 || e >= num_experts) {
    if (threadIdx.x == 0) slot_of[i] = -1;
    return;
  }
  const std::int64_t slot = slot_of[i];
  const T* src = x + (i / k) * c;
  T* dst = gathered + slot * c;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) dst[j] = src[j];
}

template <typename T>
__global__ void moe_dispatch_backward_kernel(T* __restrict__ d_x, const T* __restrict__ d_gathered,
                                             const std::int32_t* __restrict__ slot_of,
                                             std::int64_t k, std::int64_t c) {
  const std::int64_t tok = blockIdx.x;
  for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    float acc = to_f32(d_x[tok * c + j]);
    for (std::int64_t q = 0; q < k; ++q) {
      const std::int32_t s = slot_of[tok * k + q];
      if (s >= 0) acc += to_f32(d_gathered[static_cast<std::int64_t>(s) * c + j]);
    }
    d_x[tok * c + j] = from_f32<T>(acc);
  }
}

template <typename T>
__global__ void moe_combine_kernel(T* __restrict__ out, const T* __restrict__ expert_out,
                                   const float* __restrict__ weights,
                                   const std::int32_t* __restrict__ slot_of, std::int64_t k,
                                   std::int64_t c) {
  pdl_wait();
  pdl_trigger();
  // One column per thread, columns over blockIdx.y: a decode step (t = 1) spreads its row over
  // c / blockDim.x blocks instead of one block walking c in strides of dependent loads (29 us for
  // c = 2048, k = 8 on the H200 as one block; ncu, session 10). The sum per element is the same.
  const std::int64_t tok = blockIdx.x;
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  float acc = 0.0f;
  for (std::int64_t q = 0; q < k; ++q) {  // routing order: the byte-identity contract
    const std::int32_t s = slot_of[tok * k + q];
    if (s >= 0)
      acc =
          fmaf(weights[tok * k + q], to_f32(expert_out[static_cast<std::int64_t>(s) * c + j]), acc);
  }
  out[tok * c + j] = from_f32<T>(acc);
}

// One block per (token, k): d_expert_out row and the d_weight dot product.
template <typename T>
__global__ void moe_combine_backward_kernel(T* __restrict__ d_expert_out, float* __restrict__ d_w,
                                            const T* __restrict__ d_out,
                                            const T* __restrict__ expert_out,
                                            const float* __restrict__ weights,
                                            const std::int32_t* __restrict__ slot_of,
                                            std::int64_t k, std::int64_t c) {
  __shared__ float scratch[32];
  const std::int64_t i = blockIdx.x;
  const std::int64_t tok = i / k;
  const std::int32_t s = slot_of[i];
  const float w = weights[i];
  float dot = 0.0f;
  if (s >= 0) {
    for (std::int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float dy = to_f32(d_out[tok * c + j]);
      dot = fmaf(dy, to_f32(expert_out[static_cast<std::int64_t>(s) * c + j]), dot);
      d_expert_out[static_cast<std::int64_t>(s) * c + j] = from_f32<T>(w * dy);
    }
  }
  dot = block_sum(dot, scratch);
  if (threadIdx.x == 0) d_w[i] = dot;
}

unsigned row_threads(std::int64_t c) { return c >= 1024 ? 256 : (c >= 256 ? 128 : 64); }

}  // namespace

cudaError_t launch_moe_dispatch(Elt e, void* gathered, std::int32_t* expert_offsets,
                                std::int32_t* slot_of, const void* x, const std::int32_t* ids,
                                std::int64_t t, std::int64_t k, std::int64_t c,
                                std::int64_t num_experts, cudaStream_t stream) {
  const std::int64_t n = t * k;
  if (num_experts <= 0) return cudaErrorInvalidValue;
  const unsigned ne = static_cast<unsigned>(num_experts);
  moe_count_kernel<<<ne, kScanThreads, 0, stream>>>(expert_offsets, ids, n);
  moe_scan_kernel<<<1, 32, 0, stream>>>(expert_offsets, num_experts);
  if (n == 0) return cudaGetLastError();
  moe_rank_kernel<<<ne, kScanThreads, 0, stream>>>(slot_of, expert_offsets, ids, n);
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    moe_gather_kernel<T><<<static_cast<unsigned>(n), row_threads(c), 0, stream>>>(
        static_cast<T*>(gathered), slot_of, static_cast<const T*>(x), ids, k, c, num_experts);
  });
}

cudaError_t launch_moe_dispatch_backward(Elt e, void* d_x, const void* d_gathered,
                                         const std::int32_t* slot_of, std::int64_t t,
                                         std::int64_t k, std::int64_t c, cudaStream_t stream) {
  if (t == 0) return cudaSuccess;
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    moe_dispatch_backward_kernel<T><<<static_cast<unsigned>(t), row_threads(c), 0, stream>>>(
        static_cast<T*>(d_x), static_cast<const T*>(d_gathered), slot_of, k, c);
  });
}

cudaError_t launch_moe_combine(Elt e, void* out, const void* expert_out, const float* weights,
                               const std::int32_t* slot_of, std::int64_t t, std::int64_t k,
                               std::int64_t c, cudaStream_t stream) {
  if (t == 0) return cudaSuccess;
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    const unsigned threads = row_threads(c);
    const dim3 grid(static_cast<unsigned>(t), static_cast<unsigned>((c + threads - 1) / threads));
    launch_pdl(moe_combine_kernel<T>, grid, threads, 0, stream, static_cast<T*>(out),
               static_cast<const T*>(expert_out), weights, slot_of, k, c);
  });
}

cudaError_t launch_moe_combine_backward(Elt e, void* d_expert_out, float* d_weights,
                                        const void* d_out, const void* expert_out,
                                        const float* weights, const std::int32_t* slot_of,
                                        std::int64_t t, std::int64_t k, std::int64_t c,
                                        cudaStream_t stream) {
  if (t * k == 0) return cudaSuccess;
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    moe_combine_backward_kernel<T><<<static_cast<unsigned>(t * k), row_threads(c), 0, stream>>>(
        static_cast<T*>(d_expert_out), d_weights, static_cast<const T*>(d_out),
        static_cast<const T*>(expert_out), weights, slot_of, k, c);
  });
}

}  // namespace ferry::kernels::cuda
