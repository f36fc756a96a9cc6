// SPDX-License-Identifier: Apache-2.0
// MoE router: softmax over E experts, top-k (ties: lower expert id first), optional
// renormalisation, and its backward. One warp per token; top-k is K rounds of a warp argmax that
// skips experts already chosen. Deterministic. Tested in tests/gpu/kernels_moe_test.cpp.
// Two forward kernels (KernelVariant, serve_kernel_args.h): router_registers_kernel (kDecode, the
// default for E <= 256) reads each logit once into registers (lane owns experts lane + 32 u),
// exponentiates once and runs the K argmax rounds on registers with a per-lane bit mask of the
// chosen experts; router_kernel (kBaseline, FERRY_ROUTER_REGISTERS=0) re-reads the logits three
// times and the probabilities from global memory each round, with the chosen ids in a local
// array (10 us per decode layer on the H200 at E = 128, T = 1: a chain of dependent memory round
// trips). Same expressions in the same order: the same ids, probs and weights bits
// (tests/gpu/serve_decode_kernels_gpu_test.cpp).
// Also the serving engine's forced routing (serve_kernel_args.h ForcedRoutingArgs): a routing
// hook's ids applied to the router's output on the device, bit-equal to its CPU twin
// serve::apply_forced_rows (tests/gpu/serve_gpu_test.cpp).
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/serve_launchers.h"

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
  pdl_wait();
  pdl_trigger();
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

// kPer = ceil(E / 32) <= 8 experts per lane (E <= 256). The baseline's arithmetic exactly:
// max and sum lane-partial in expert order then the xor trees, p = __expf(l - max) * (1 / sum),
// the argmax over (p desc, id asc) per lane in expert order then the same xor tree, lane 0's
// winner taken (broadcast), total summed in round order.
template <typename T, int kPer>
__global__ void router_registers_kernel(float* __restrict__ weights, std::int32_t* __restrict__ ids,
                                        float* __restrict__ probs, const T* __restrict__ logits,
                                        std::int64_t t, std::int64_t e, int k, bool renormalize) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const std::int64_t tok =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (tok >= t) return;
  const T* l = logits + tok * e;
  float* p = probs + tok * e;
  float v[kPer];
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    const std::int64_t i = lane + 32 * u;
    v[u] = i < e ? to_f32(l[i]) : 0.0f;
  }
  float mx = -INFINITY;
#pragma unroll
  for (int u = 0; u < kPer; ++u)
    if (lane + 32 * u < e) mx = fmaxf(mx, v[u]);
  mx = warp_max(mx);
  float sum = 0.0f;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    if (lane + 32 * u < e) {
      v[u] = __expf(v[u] - mx);
      sum += v[u];
    }
  }
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
#pragma unroll
  for (int u = 0; u < kPer; ++u) {
    if (lane + 32 * u < e) {
      v[u] = v[u] * inv;
      p[lane + 32 * u] = v[u];
    }
  }
  unsigned taken = 0;  // bit u: expert lane + 32 u already chosen
  int my_id = 0;       // lane j < k: the j-th choice
  float my_p = 0.0f, total = 0.0f;
  for (int j = 0; j < k; ++j) {
    float bp = -1.0f;
    int bid = 0x7fffffff;
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int i = lane + 32 * u;
      if (i < e && ((taken >> u) & 1u) == 0 && better(v[u], i, bp, bid)) {
        bp = v[u];
        bid = i;
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
    bp = __shfl_sync(0xffffffffu, bp, 0);
    bid = __shfl_sync(0xffffffffu, bid, 0);
#pragma unroll
    for (int u = 0; u < kPer; ++u)
      if (lane + 32 * u == bid) taken |= 1u << u;
    if (lane == j) {
      my_id = bid;
      my_p = bp;
    }
    total += bp;
  }
  if (lane < k) {
    ids[tok * k + lane] = my_id;
    weights[tok * k + lane] = renormalize ? my_p / total : my_p;
  }
}

// FERRY_ROUTER_REGISTERS=0: both baselines (router_kernel, forced_routing_kernel).
bool router_registers_env_on() {
  static const bool on = [] {
    const char* s = std::getenv("FERRY_ROUTER_REGISTERS");
    return s == nullptr || s[0] != '0';
  }();
  return on;
}

template <typename T>
cudaError_t launch_router_typed(float* weights, std::int32_t* ids, float* probs, const T* logits,
                                std::int64_t t, std::int64_t e, int k, bool renormalize,
                                KernelVariant variant, cudaStream_t stream) {
  const bool regs = variant == KernelVariant::kDecode ||
                    (variant == KernelVariant::kDefault && router_registers_env_on());
  const unsigned blocks = static_cast<unsigned>((t + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const dim3 threads(32 * kWarpsPerBlock);
  if (regs && e <= 32) {
    launch_pdl(router_registers_kernel<T, 1>, blocks, threads, 0, stream, weights, ids, probs,
               logits, t, e, k, renormalize);
  } else if (regs && e <= 64) {
    launch_pdl(router_registers_kernel<T, 2>, blocks, threads, 0, stream, weights, ids, probs,
               logits, t, e, k, renormalize);
  } else if (regs && e <= 128) {
    launch_pdl(router_registers_kernel<T, 4>, blocks, threads, 0, stream, weights, ids, probs,
               logits, t, e, k, renormalize);
  } else if (regs && e <= 256) {
    launch_pdl(router_registers_kernel<T, 8>, blocks, threads, 0, stream, weights, ids, probs,
               logits, t, e, k, renormalize);
  } else {
    launch_pdl(router_kernel<T>, blocks, threads, 0, stream, weights, ids, probs, logits, t, e, k,
               renormalize);
  }
  return cudaGetLastError();
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

// One thread per token: the row is short (K <= 32) and T is a decode step's few tokens.
__global__ void forced_routing_kernel(ForcedRoutingArgs a) {
  pdl_wait();
  pdl_trigger();
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= a.T) return;
  const std::int32_t* f = a.forced + t * a.K;
  std::int32_t* ids = a.ids + t * a.K;
  if (f[0] < 0) return;  // the hook kept the router's choice
  bool same = true;
  for (int k = 0; k < a.K; ++k) same = same && ids[k] == f[k];
  if (same) return;  // as the host hook path: the router's weights stay
  const float* p = a.probs + t * a.E;
  float* w = a.weights + t * a.K;
  // weights_for_ids' arithmetic: plain f32 adds in k order, then IEEE division (no contraction
  // is possible: there is no multiply).
  float sum = 0.0f;
  for (int k = 0; k < a.K; ++k) {
    const float pk = p[f[k]];
    w[k] = pk;
    sum += pk;
  }
  if (a.renormalize) {
    for (int k = 0; k < a.K; ++k) w[k] = __fdiv_rn(w[k], sum);
  }
  for (int k = 0; k < a.K; ++k) ids[k] = f[k];
}

// The same rule with a warp per token (the default; FERRY_ROUTER_REGISTERS=0 runs the thread per
// token above): lane k < K loads forced[k], ids[k] and probs[forced[k]] at once instead of one
// dependent load after another (the thread's short-circuit compare and its weight stores, which
// may alias probs, serialized ~2K memory round trips: 5.7 us per decode layer on the H200). The
// sum is the same f32 adds in k order (lane k's value broadcast in turn), then __fdiv_rn.
__global__ void forced_routing_warp_kernel(ForcedRoutingArgs a) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const std::int64_t t =
      static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (t >= a.T) return;
  const bool in = lane < a.K;
  const std::int32_t fk = in ? a.forced[t * a.K + lane] : 0;
  const std::int32_t ik = in ? a.ids[t * a.K + lane] : 0;
  if (__shfl_sync(0xffffffffu, fk, 0) < 0) return;              // the hook kept the router's choice
  if (__ballot_sync(0xffffffffu, in && ik != fk) == 0) return;  // the router's weights stay
  const float pk = in ? a.probs[t * a.E + fk] : 0.0f;
  float sum = 0.0f;
  for (int k = 0; k < a.K; ++k) sum += __shfl_sync(0xffffffffu, pk, k);
  if (in) {
    a.weights[t * a.K + lane] = a.renormalize ? __fdiv_rn(pk, sum) : pk;
    a.ids[t * a.K + lane] = fk;
  }
}

}  // namespace

cudaError_t launch_forced_routing(const ForcedRoutingArgs& a, cudaStream_t stream) {
  if (a.T <= 0) return cudaSuccess;
  if (a.K < 1 || a.K > kMaxK) return cudaErrorInvalidValue;
  if (router_registers_env_on()) {
    const unsigned blocks = static_cast<unsigned>((a.T + kWarpsPerBlock - 1) / kWarpsPerBlock);
    launch_pdl(forced_routing_warp_kernel, blocks, 32 * kWarpsPerBlock, 0, stream, a);
    return cudaGetLastError();
  }
  constexpr int kThreads = 128;
  const unsigned blocks = static_cast<unsigned>((a.T + kThreads - 1) / kThreads);
  launch_pdl(forced_routing_kernel, blocks, kThreads, 0, stream, a);
  return cudaGetLastError();
}

cudaError_t launch_router(Elt e_logits, float* weights, std::int32_t* ids, float* probs,
                          const void* logits, std::int64_t t, std::int64_t e, int k,
                          bool renormalize, cudaStream_t stream) {
  if (t == 0) return cudaSuccess;
  if (k < 1 || k > kMaxK || k > e) return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  const cudaError_t d = dispatch_elt(e_logits, [&](auto tag) {
    using T = decltype(tag);
    err = launch_router_typed<T>(weights, ids, probs, static_cast<const T*>(logits), t, e, k,
                                 renormalize, KernelVariant::kDefault, stream);
  });
  return d != cudaSuccess ? d : err;
}

cudaError_t launch_router_f32(float* weights, std::int32_t* ids, float* probs, const float* logits,
                              std::int64_t t, std::int64_t e, int k, bool renormalize,
                              KernelVariant variant, cudaStream_t stream) {
  if (t == 0) return cudaSuccess;
  if (k < 1 || k > kMaxK || k > e) return cudaErrorInvalidValue;
  return launch_router_typed<float>(weights, ids, probs, logits, t, e, k, renormalize, variant,
                                    stream);
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
