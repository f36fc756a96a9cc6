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
#include "kernels/cuda/common.cuh"
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

template <typename W>
__global__ void expert_ffn_up_kernel(ExpertFfnArgs a) {
  const int lane = threadIdx.x & 31;
  const std::int64_t p = a.row_begin + blockIdx.x;
  const std::int64_t f = std::int64_t(blockIdx.y) * kWarps + (threadIdx.x >> 5);
  if (p >= a.row_end || f >= a.F) return;
  const std::int64_t i = a.row_list != nullptr ? a.row_list[p] : p;
  const std::int32_t e = a.ids[i];
  const W* gate = e >= 0 && e < a.E ? static_cast<const W*>(a.table[e]) : nullptr;
  const W* up = e >= 0 && e < a.E ? static_cast<const W*>(a.table[a.E + e]) : nullptr;
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
  const int lane = threadIdx.x & 31;
  const std::int64_t p = a.row_begin + blockIdx.x;
  const std::int64_t c = std::int64_t(blockIdx.y) * kWarps + (threadIdx.x >> 5);
  if (p >= a.row_end || c >= a.C) return;
  const std::int64_t i = a.row_list != nullptr ? a.row_list[p] : p;
  const std::int32_t e = a.ids[i];
  const W* down = e >= 0 && e < a.E ? static_cast<const W*>(a.table[2 * a.E + e]) : nullptr;
  float r = 0.0f;
  if (down != nullptr) r = dot_warp(down + c * a.F, a.act + i * a.F, a.F, lane);
  if (lane == 0) a.out[i * a.C + c] = r;
}

template <typename W>
cudaError_t launch_typed(const ExpertFfnArgs& a, std::int64_t rows, cudaStream_t stream) {
  const dim3 g1(static_cast<unsigned>(rows), static_cast<unsigned>((a.F + kWarps - 1) / kWarps));
  expert_ffn_up_kernel<W><<<g1, kWarps * 32, 0, stream>>>(a);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const dim3 g2(static_cast<unsigned>(rows), static_cast<unsigned>((a.C + kWarps - 1) / kWarps));
  expert_ffn_down_kernel<W><<<g2, kWarps * 32, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_expert_ffn(const ExpertFfnArgs& a, cudaStream_t stream) {
  const std::int64_t rows = a.row_end - a.row_begin;
  if (rows <= 0) return cudaSuccess;
  return a.bf16 ? launch_typed<__nv_bfloat16>(a, rows, stream)
                : launch_typed<float>(a, rows, stream);
}

}  // namespace ferry::kernels::cuda
