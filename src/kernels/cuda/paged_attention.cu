// SPDX-License-Identifier: Apache-2.0
// kv_write and paged_attention of serve_kernels.h (f32 K/V; why f32: see that header).
// paged_attention: one warp per (token, head). The warp holds q in registers (lane owns elements
// d = lane + 32 i), walks the token's positions 0..pos[t] in order, reading each key/value row
// through the block table, and keeps the online-softmax state (m, l, acc) exactly as the CPU twin
// serve/paged_attention.cpp does: s = (q . k) * scale; m' = max(m, s); acc = acc * e^(m - m') +
// e^(s - m') v; l likewise. The dot product is a lane-strided partial sum then a fixed xor tree,
// so the result is independent of which other tokens share the step (no cross-token state).
// Keys are loaded kKeys at a time (the updates stay in position order); long decodes would want
// keys split over warps (flash-decoding), see docs/serve.md "not done".
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/serve_launchers.h"

namespace ferry::kernels::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps per block
constexpr int kKeys = 8;       // keys whose rows are in flight together

__device__ __forceinline__ float* kv_row(const PagedKvLayout& kv, int layer, const PagedStep& s,
                                         std::int64_t t, std::int64_t j, int which) {
  const std::int32_t* table = s.tables + std::int64_t(s.seq_of[t]) * s.table_stride;
  const std::int64_t blk = table[j / kv.block_tokens];
  const std::int64_t row = std::int64_t(kv.G) * kv.D;
  return kv.base + std::int64_t(layer) * kv.layer_stride +
         (blk * 2 + which) * std::int64_t(kv.block_tokens) * row + (j % kv.block_tokens) * row;
}

__global__ void kv_write_kernel(PagedKvLayout kv, int layer, PagedStep s,
                                const float* __restrict__ k, const float* __restrict__ v) {
  const std::int64_t row = std::int64_t(kv.G) * kv.D;
  const std::int64_t n = s.T * row;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / row, c = i % row;
    kv_row(kv, layer, s, t, s.pos[t], 0)[c] = k[i];
    kv_row(kv, layer, s, t, s.pos[t], 1)[c] = v[i];
  }
}

template <int kNv>  // elements per lane: ceil(D / 32)
__global__ void paged_attention_kernel(PagedKvLayout kv, int layer, PagedStep s,
                                       float* __restrict__ out, const float* __restrict__ q, int H,
                                       float scale) {
  const std::int64_t item = (blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (item >= s.T * H) return;
  const std::int64_t t = item / H;
  const int h = static_cast<int>(item % H);
  const int D = kv.D;
  const int g = h / (H / kv.G);
  const float* qh = q + item * D;
  float qv[kNv], acc[kNv];
#pragma unroll
  for (int i = 0; i < kNv; ++i) {
    const int d = lane + 32 * i;
    qv[i] = d < D ? qh[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const std::int64_t last = s.pos[t];
  // Keys in chunks of kKeys: the chunk's K and V rows are loaded (and its dot products reduced)
  // before the online-softmax updates, which then run key by key in position order exactly as
  // before; a key per iteration left every load's latency exposed (34 us per decode layer at
  // 16-48 positions on the H200, ncu, session 10).
  for (std::int64_t j0 = 0; j0 <= last; j0 += kKeys) {
    const int n = static_cast<int>(last - j0 + 1 < kKeys ? last - j0 + 1 : kKeys);
    float part[kKeys], vr[kKeys][kNv];
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      part[u] = 0.0f;
      if (u < n) {
        const float* kj = kv_row(kv, layer, s, t, j0 + u, 0) + g * D;
        const float* vj = kv_row(kv, layer, s, t, j0 + u, 1) + g * D;
#pragma unroll
        for (int i = 0; i < kNv; ++i) {
          const int d = lane + 32 * i;
          if (d < D) {
            part[u] += qv[i] * kj[d];
            vr[u][i] = vj[d];
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kKeys; ++u) part[u] = warp_sum(part[u]);  // the same value in every lane
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      if (u < n) {
        const float sc = part[u] * scale;
        const float m_new = fmaxf(m, sc);
        const float alpha = expf(m - m_new);  // 0 on the first key (m = -inf)
        const float p = expf(sc - m_new);
#pragma unroll
        for (int i = 0; i < kNv; ++i) {
          const int d = lane + 32 * i;
          if (d < D) acc[i] = acc[i] * alpha + p * vr[u][i];
        }
        l = l * alpha + p;
        m = m_new;
      }
    }
  }
  const float inv_l = 1.0f / l;
  float* o = out + item * D;
#pragma unroll
  for (int i = 0; i < kNv; ++i) {
    const int d = lane + 32 * i;
    if (d < D) o[d] = acc[i] * inv_l;
  }
}

}  // namespace

cudaError_t launch_kv_write(const PagedKvLayout& kv, int layer, const PagedStep& step,
                            const float* k, const float* v, cudaStream_t stream) {
  if (step.T <= 0) return cudaSuccess;
  kv_write_kernel<<<grid_for(step.T * kv.G * kv.D, 256), 256, 0, stream>>>(kv, layer, step, k, v);
  return cudaGetLastError();
}

cudaError_t launch_paged_attention(const PagedKvLayout& kv, int layer, const PagedStep& step,
                                   float* out, const float* q, int H, float scale,
                                   cudaStream_t stream) {
  if (step.T <= 0) return cudaSuccess;
  const std::int64_t warps = step.T * H;
  const unsigned grid = static_cast<unsigned>((warps * 32 + kThreads - 1) / kThreads);
  switch ((kv.D + 31) / 32) {
    case 1:
      paged_attention_kernel<1><<<grid, kThreads, 0, stream>>>(kv, layer, step, out, q, H, scale);
      break;
    case 2:
      paged_attention_kernel<2><<<grid, kThreads, 0, stream>>>(kv, layer, step, out, q, H, scale);
      break;
    case 3:
    case 4:
      paged_attention_kernel<4><<<grid, kThreads, 0, stream>>>(kv, layer, step, out, q, H, scale);
      break;
    default:  // 5..8 (D <= 256, checked by the caller)
      paged_attention_kernel<8><<<grid, kThreads, 0, stream>>>(kv, layer, step, out, q, H, scale);
      break;
  }
  return cudaGetLastError();
}

}  // namespace ferry::kernels::cuda
