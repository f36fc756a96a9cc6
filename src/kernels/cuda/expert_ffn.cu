// SPDX-License-Identifier: Apache-2.0
// expert_ffn of serve_kernels.h: the routed experts' SwiGLU FFN, f32 arithmetic on f32 or bf16
// weights (widened exactly on load), one warp per output element, weights reached through a
// [3, E] table of per-expert pointers.
//   pass 1, grid (rows, ceil(F / 8)): warp -> (row i, f): g = gate_e[f] . x_t, u = up_e[f] . x_t,
//           act[i, f] = g / (1 + e^-g) * u
//   pass 2, grid (rows, ceil(C / 8)): warp -> (row i, c): out[i, c] = down_e[c] . act[i]
// Each dot product: lane-strided partial sums in index order, then warp_sum's fixed xor tree.
// Nothing depends on the pointer values, on which rows share the launch, on the launch's row
// range or on the row list that picks them, so an expert gives the same bits from any slot and in
// any token group: what makes the resident, static and paged modes bit-identical on CUDA
// (tests/gpu/serve_gpu_test.cpp). Plain on purpose (each row re-reads its expert's weights):
// correctness and identity first; a grouped GEMM over the rows of one expert is the obvious next
// step (docs/serve.md).
// Two kernel pairs (KernelVariant, serve_kernel_args.h; docs/cuda.md "Decode kernels"), the same
// grids and warp -> output map, different dot products:
//   chunked (kDecode, the default): lane owns the 8-element chunks c = lane + 32 r of the row
//     (elements 8c .. 8c + 7), read as 16-byte loads (one uint4 of bf16, two float4 of f32) with
//     kUnroll chunks of every matrix in flight; the partial sum runs over the lane's chunks in
//     increasing c, each chunk's elements in order, then the n % 8 tail elements (lane i: element
//     8 floor(n / 8) + i), then warp_sum. The lane-strided 2-byte loads of the baseline moved 64
//     bytes per warp instruction (24 us for the 50 MB of a Qwen3-30B-A3B decode layer's gate/up,
//     ~2.1 TB/s on the H200). A row not 16-byte aligned (a slot at an odd address, C % 8 != 0)
//     is read element by element in the same order: the bits never depend on the address.
//   baseline (kBaseline, FERRY_EXPERT_FFN_CHUNKED=0): lane-strided partial sums (lane i: elements
//     i, i + 32, ...) then warp_sum.
// Both hold f32 and bf16 weights to one order (bf16 == f32 on the widened weights), and neither
// depends on slots, grouping or row lists; the two variants differ from each other in rounding.
#include <cstdint>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/serve_launchers.h"

namespace ferry::kernels::cuda {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ float widen(float w) { return w; }
__device__ __forceinline__ float widen(__nv_bfloat16 w) { return __bfloat162float(w); }

// W: float or __nv_bfloat16 (exactly widened); the products and sums are f32 in one order.
template <typename W>
__device__ __forceinline__ float dot_warp(const W* __restrict__ a, const float* __restrict__ b,
                                          std::int64_t n, int lane) {
  float s = 0.0f;
  for (std::int64_t i = lane; i < n; i += 32) s += widen(a[i]) * b[i];
  return warp_sum(s);
}

// Position p's row of this launch and its expert id; false when the launch does not compute it
// (row_filter with miss_log: misses are the log's miss_expert[0, misses) (SlotStateLayout: header
// 5, then ids [E], miss_expert [E]), a handful per decode layer, so a scan). The same answer for
// every thread of a block (one row per block).
__device__ __forceinline__ bool launch_row(const ExpertFfnArgs& a, std::int64_t p, std::int64_t* i,
                                           std::int32_t* e) {
  *i = a.row_list != nullptr ? a.row_list[p] : p;
  *e = a.ids[*i];
  if (a.row_filter == ExpertRowFilter::kAll) return true;
  const std::int32_t misses = a.miss_log[1];
  const std::int32_t* miss_expert = a.miss_log + SlotStateLayout::kLogHeader + a.E;
  bool missed = false;
  for (std::int32_t j = 0; j < misses; ++j) missed = missed || miss_expert[j] == *e;
  return missed == (a.row_filter == ExpertRowFilter::kMisses);
}

// Matrix m (0 gate, 1 up, 2 down) of expert e; null for an id outside [0, E) (a zero row).
template <typename W>
__device__ __forceinline__ const W* expert_matrix(const ExpertFfnArgs& a, int m, std::int32_t e) {
  return e >= 0 && e < a.E ? static_cast<const W*>(a.table[m * a.E + e]) : nullptr;
}

template <typename W>
__global__ void expert_ffn_up_kernel(ExpertFfnArgs a) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const std::int64_t p = a.row_begin + blockIdx.x;
  const std::int64_t f = std::int64_t(blockIdx.y) * kWarps + (threadIdx.x >> 5);
  if (p >= a.row_end || f >= a.F) return;
  std::int64_t i;
  std::int32_t e;
  if (!launch_row(a, p, &i, &e)) return;
  const W* gate = expert_matrix<W>(a, 0, e);
  const W* up = expert_matrix<W>(a, 1, e);
  float r = 0.0f;
  if (gate != nullptr && up != nullptr) {
    const float* x = a.x + (i / a.K) * a.C;
    const float g = dot_warp(gate + f * a.C, x, a.C, lane);
    const float u = dot_warp(up + f * a.C, x, a.C, lane);
    r = g / (1.0f + expf(-g)) * u;
  }
  if (lane == 0) a.act[i * a.F + f] = r;
}

template <typename W>
__global__ void expert_ffn_down_kernel(ExpertFfnArgs a) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const std::int64_t p = a.row_begin + blockIdx.x;
  const std::int64_t c = std::int64_t(blockIdx.y) * kWarps + (threadIdx.x >> 5);
  if (p >= a.row_end || c >= a.C) return;
  std::int64_t i;
  std::int32_t e;
  if (!launch_row(a, p, &i, &e)) return;
  const W* down = expert_matrix<W>(a, 2, e);
  float r = 0.0f;
  if (down != nullptr) r = dot_warp(down + c * a.F, a.act + i * a.F, a.F, lane);
  if (lane == 0) a.out[i * a.C + c] = r;
}

constexpr int kUnroll = 4;  // chunked: 8-element chunks per lane and matrix in flight

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

// r[0..7] = widened p[0..7]; kVec: p is 16-byte aligned (one or two 16-byte loads).
template <bool kVec>
__device__ __forceinline__ void load8(const float* p, float (&r)[8]) {
  if constexpr (kVec) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p));
    const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
    r[0] = a.x, r[1] = a.y, r[2] = a.z, r[3] = a.w, r[4] = b.x, r[5] = b.y, r[6] = b.z, r[7] = b.w;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) r[k] = p[k];
  }
}
template <bool kVec>
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&r)[8]) {
  if constexpr (kVec) {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
    const unsigned w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // bf16 -> f32 is exact: the bits moved to the high half
      r[2 * k] = __uint_as_float(w[k] << 16);
      r[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) r[k] = __bfloat162float(p[k]);
  }
}

// s[m] += the lane's chunks of w[m] . x (chunks c = lane + 32 r < n / 8, in increasing c).
template <bool kVec, int kM, typename W>
__device__ __forceinline__ void dot_chunks(const W* const (&w)[kM], const float* __restrict__ x,
                                           std::int64_t nc, int lane, float (&s)[kM]) {
  for (std::int64_t c0 = lane; c0 < nc; c0 += 32 * kUnroll) {
    float xr[kUnroll][8], wr[kM][kUnroll][8];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::int64_t c = c0 + 32 * u;
      if (c < nc) {
        load8<kVec>(x + 8 * c, xr[u]);
#pragma unroll
        for (int m = 0; m < kM; ++m) load8<kVec>(w[m] + 8 * c, wr[m][u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c0 + 32 * u < nc) {
#pragma unroll
        for (int m = 0; m < kM; ++m) {
#pragma unroll
          for (int k = 0; k < 8; ++k) s[m] = fmaf(wr[m][u][k], xr[u][k], s[m]);
        }
      }
    }
  }
}

// s[m] = w[m][0, n) . x[0, n) for kM matrices sharing x, in the chunked order (top of file); the
// 16-byte loads only where every row and x are 16-byte aligned, the same order either way.
template <int kM, typename W>
__device__ __forceinline__ void dot_chunked(const W* const (&w)[kM], const float* __restrict__ x,
                                            std::int64_t n, int lane, float (&s)[kM]) {
  bool vec = aligned16(x);
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    vec = vec && aligned16(w[m]);
    s[m] = 0.0f;
  }
  const std::int64_t nc = n >> 3;
  if (vec) {
    dot_chunks<true>(w, x, nc, lane, s);
  } else {
    dot_chunks<false>(w, x, nc, lane, s);
  }
  const std::int64_t i = 8 * nc + lane;  // the tail: fewer than 8 elements
  if (i < n) {
#pragma unroll
    for (int m = 0; m < kM; ++m) s[m] = fmaf(widen(w[m][i]), x[i], s[m]);
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) s[m] = warp_sum(s[m]);
}

template <typename W>
__global__ void expert_ffn_up_chunked_kernel(ExpertFfnArgs a) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const std::int64_t p = a.row_begin + blockIdx.x;
  const std::int64_t f = std::int64_t(blockIdx.y) * kWarps + (threadIdx.x >> 5);
  if (p >= a.row_end || f >= a.F) return;
  std::int64_t i;
  std::int32_t e;
  if (!launch_row(a, p, &i, &e)) return;
  const W* gate = expert_matrix<W>(a, 0, e);
  const W* up = expert_matrix<W>(a, 1, e);
  float r = 0.0f;
  if (gate != nullptr && up != nullptr) {
    const W* const rows[2] = {gate + f * a.C, up + f * a.C};
    float gu[2];
    dot_chunked<2>(rows, a.x + (i / a.K) * a.C, a.C, lane, gu);
    r = gu[0] / (1.0f + expf(-gu[0])) * gu[1];
  }
  if (lane == 0) a.act[i * a.F + f] = r;
}

template <typename W>
__global__ void expert_ffn_down_chunked_kernel(ExpertFfnArgs a) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const std::int64_t p = a.row_begin + blockIdx.x;
  const std::int64_t c = std::int64_t(blockIdx.y) * kWarps + (threadIdx.x >> 5);
  if (p >= a.row_end || c >= a.C) return;
  std::int64_t i;
  std::int32_t e;
  if (!launch_row(a, p, &i, &e)) return;
  const W* down = expert_matrix<W>(a, 2, e);
  float r[1] = {0.0f};
  if (down != nullptr) {
    const W* const rows[1] = {down + c * a.F};
    dot_chunked<1>(rows, a.act + i * a.F, a.F, lane, r);
  }
  if (lane == 0) a.out[i * a.C + c] = r[0];
}

template <typename W>
cudaError_t launch_typed(const ExpertFfnArgs& a, std::int64_t rows, bool chunked,
                         cudaStream_t stream) {
  const dim3 g1(static_cast<unsigned>(rows), static_cast<unsigned>((a.F + kWarps - 1) / kWarps));
  if (chunked) {
    launch_pdl(expert_ffn_up_chunked_kernel<W>, g1, kWarps * 32, 0, stream, a);
  } else {
    launch_pdl(expert_ffn_up_kernel<W>, g1, kWarps * 32, 0, stream, a);
  }
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const dim3 g2(static_cast<unsigned>(rows), static_cast<unsigned>((a.C + kWarps - 1) / kWarps));
  if (chunked) {
    launch_pdl(expert_ffn_down_chunked_kernel<W>, g2, kWarps * 32, 0, stream, a);
  } else {
    launch_pdl(expert_ffn_down_kernel<W>, g2, kWarps * 32, 0, stream, a);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_expert_ffn(const ExpertFfnArgs& a, KernelVariant variant, cudaStream_t stream) {
  static const bool env_on = [] {
    const char* v = std::getenv("FERRY_EXPERT_FFN_CHUNKED");
    return v == nullptr || v[0] != '0';
  }();
  const bool chunked =
      variant == KernelVariant::kDecode || (variant == KernelVariant::kDefault && env_on);
  const std::int64_t rows = a.row_end - a.row_begin;
  if (rows <= 0) return cudaSuccess;
  return a.bf16 ? launch_typed<__nv_bfloat16>(a, rows, chunked, stream)
                : launch_typed<float>(a, rows, chunked, stream);
}

}  // namespace ferry::kernels::cuda
