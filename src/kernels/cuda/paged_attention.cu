// SPDX-License-Identifier: Apache-2.0
// kv_write and paged_attention of serve_kernels.h, over an f32 or a bf16 pool (PagedKvLayout::bf16:
// each kernel is instantiated for both; a bf16 row is rounded to nearest even when written and
// each element widened exactly when read, the arithmetic is the f32 kernels').
// Two paged_attention kernels (KernelVariant, serve_kernel_args.h; docs/cuda.md "Decode kernels"):
//   split (kDecode, the default): one CTA of kW warps per (token, head). The token's positions
//     0..pos[t] are cut into chunks of kKeys; chunk c goes to warp c % kW, which keeps its own
//     online-softmax state (m, l, acc) over its chunks in position order (the baseline's
//     update), with 16-byte loads (8-byte for bf16; lane owns elements 4 (lane + 32 i) .. + 3).
//     The kW states are combined in shared memory in warp order: M = max m_w,
//     o = sum_w acc_w e^(m_w - M) / sum_w l_w e^(m_w - M). A decode at 160 positions is 20
//     chunks: at most 2 per warp instead of 20 in a row. Needs D % 4 == 0, 16-byte aligned q / out
//     and a 16-byte (f32) or 8-byte (bf16) aligned pool (else the baseline runs).
//   baseline (kBaseline, FERRY_PAGED_ATTN_SPLIT=0): one warp per (token, head), walking the
//     positions in order exactly as the CPU twin serve/paged_attention.cpp does: s = (q . k) *
//     scale; m' = max(m, s); acc = acc * e^(m - m') + e^(s - m') v; l likewise; keys loaded
//     kKeys at a time. Kept as the reference twin in tests/gpu/serve_decode_kernels_gpu_test.cpp.
// Both: every dot product is a lane-partial sum then a fixed xor tree, the split and the combine
// order depend only on the token's own pos[t] and on D, never on T, on the other tokens of the
// step or on the grid: the same bits every run and for a token in any batch (batch invariance,
// asserted by the GPU tests). A token in a prefill chunk takes the same path as a decode.
// Long contexts would still want keys split over CTAs (a workspace or clusters): docs/cuda.md.
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/paged_kv_row.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/serve_launchers.h"

namespace ferry::kernels::cuda {
namespace {

constexpr int kThreads = 128;  // baseline: 4 warps per block
constexpr int kKeys = 8;       // keys whose rows are in flight together (per warp)

template <typename Elem>
__global__ void kv_write_kernel(PagedKvLayout kv, int layer, PagedStep s,
                                const float* __restrict__ k, const float* __restrict__ v) {
  pdl_wait();
  pdl_trigger();
  const std::int64_t row = std::int64_t(kv.G) * kv.D;
  const std::int64_t n = s.T * row;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / row, c = i % row;
    kv_row<Elem>(kv, layer, s, t, s.pos[t], 0)[c] = from_f32<Elem>(k[i]);
    kv_row<Elem>(kv, layer, s, t, s.pos[t], 1)[c] = from_f32<Elem>(v[i]);
  }
}

template <int kNv, typename Elem>  // elements per lane: ceil(D / 32); the pool's element type
__global__ void paged_attention_warp_kernel(PagedKvLayout kv, int layer, PagedStep s,
                                            float* __restrict__ out, const float* __restrict__ q,
                                            int H, float scale) {
  pdl_wait();
  pdl_trigger();
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
        const Elem* kj = kv_row<Elem>(kv, layer, s, t, j0 + u, 0) + g * D;
        const Elem* vj = kv_row<Elem>(kv, layer, s, t, j0 + u, 1) + g * D;
#pragma unroll
        for (int i = 0; i < kNv; ++i) {
          const int d = lane + 32 * i;
          if (d < D) {
            part[u] += qv[i] * to_f32(kj[d]);
            vr[u][i] = to_f32(vj[d]);
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

// Four consecutive elements c*4 .. c*4 + 3 of a row as f32: one 16-byte load (f32) or one 8-byte
// load of four bf16 widened exactly (element 0 in the low half of the first word).
__device__ __forceinline__ float4 load4(const float* row, int c) {
  return __ldg(reinterpret_cast<const float4*>(row) + c);
}
__device__ __forceinline__ float4 load4(const bf16* row, int c) {
  const uint2 u = __ldg(reinterpret_cast<const uint2*>(row) + c);
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                     __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float s) {
  s = fmaf(a.x, b.x, s);
  s = fmaf(a.y, b.y, s);
  s = fmaf(a.z, b.z, s);
  return fmaf(a.w, b.w, s);
}

// kNc: 4-element chunks per lane (ceil(D / 128)); kW: warps per CTA; Elem: the pool's element
// type. One CTA per item = t * H + h.
template <int kNc, int kW, typename Elem>
__global__ void __launch_bounds__(kW * 32)
    paged_attention_split_kernel(PagedKvLayout kv, int layer, PagedStep s, float* __restrict__ out,
                                 const float* __restrict__ q, int H, float scale) {
  pdl_wait();
  pdl_trigger();
  __shared__ float sh_m[kW], sh_l[kW];
  __shared__ float4 sh_acc[kW][kNc * 32];
  const std::int64_t item = blockIdx.x;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const std::int64_t t = item / H;
  const int h = static_cast<int>(item % H);
  const int D4 = kv.D >> 2;  // 4-element chunks of a head
  const int g = h / (H / kv.G);
  const std::int64_t row = std::int64_t(kv.G) * kv.D;  // elements of one cache row
  const std::int64_t blk_elems = std::int64_t(kv.block_tokens) * row;
  const Elem* layer_base = static_cast<const Elem*>(kv.base) +
                           std::int64_t(layer) * kv.layer_stride + std::int64_t(g) * kv.D;
  const std::int32_t* table = s.tables + std::int64_t(s.seq_of[t]) * s.table_stride;
  const std::int64_t n = std::int64_t(s.pos[t]) + 1;  // positions 0..pos[t]
  const float4* qh = reinterpret_cast<const float4*>(q + item * kv.D);
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 qv[kNc], acc[kNc];
#pragma unroll
  for (int i = 0; i < kNc; ++i) {
    const int c = lane + 32 * i;
    qv[i] = c < D4 ? qh[c] : zero;
    acc[i] = zero;
  }
  float m = -INFINITY, l = 0.0f;
  // This warp's chunks: keys [j0, j0 + kKeys) for j0 = (warp + kW r) * kKeys, r = 0, 1, ...
  for (std::int64_t j0 = std::int64_t(warp) * kKeys; j0 < n; j0 += std::int64_t(kW) * kKeys) {
    const int cnt = static_cast<int>(n - j0 < kKeys ? n - j0 : kKeys);
    float part[kKeys];
    float4 vr[kKeys][kNc];
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      part[u] = 0.0f;
      if (u < cnt) {
        const std::int64_t j = j0 + u;
        const Elem* kj = layer_base + std::int64_t(table[j / kv.block_tokens]) * 2 * blk_elems +
                         (j % kv.block_tokens) * row;
        const Elem* vj = kj + blk_elems;
#pragma unroll
        for (int i = 0; i < kNc; ++i) {
          const int c = lane + 32 * i;
          if (c < D4) {
            part[u] = dot4(qv[i], load4(kj, c), part[u]);
            vr[u][i] = load4(vj, c);
          } else {
            vr[u][i] = zero;
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kKeys; ++u) part[u] = warp_sum(part[u]);  // the same value in every lane
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      if (u < cnt) {
        const float sc = part[u] * scale;
        const float m_new = fmaxf(m, sc);
        const float alpha = expf(m - m_new);  // 0 on the warp's first key (m = -inf)
        const float p = expf(sc - m_new);
#pragma unroll
        for (int i = 0; i < kNc; ++i) {
          acc[i].x = acc[i].x * alpha + p * vr[u][i].x;
          acc[i].y = acc[i].y * alpha + p * vr[u][i].y;
          acc[i].z = acc[i].z * alpha + p * vr[u][i].z;
          acc[i].w = acc[i].w * alpha + p * vr[u][i].w;
        }
        l = l * alpha + p;
        m = m_new;
      }
    }
  }
  // A warp without keys holds m = -inf, l = 0, acc = 0: its weight e^(-inf - M) is 0. Warp 0
  // always has position 0, so M is finite.
  if (lane == 0) {
    sh_m[warp] = m;
    sh_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kNc; ++i) sh_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  for (int c = static_cast<int>(threadIdx.x); c < D4; c += kW * 32) {
    float mx = sh_m[0];
#pragma unroll
    for (int w = 1; w < kW; ++w) mx = fmaxf(mx, sh_m[w]);
    float den = 0.0f;
    float4 num = zero;
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      const float a = expf(sh_m[w] - mx);
      const float4 v = sh_acc[w][c];
      den = fmaf(sh_l[w], a, den);
      num.x = fmaf(v.x, a, num.x);
      num.y = fmaf(v.y, a, num.y);
      num.z = fmaf(v.z, a, num.z);
      num.w = fmaf(v.w, a, num.w);
    }
    const float inv = 1.0f / den;
    reinterpret_cast<float4*>(out + item * kv.D)[c] =
        make_float4(num.x * inv, num.y * inv, num.z * inv, num.w * inv);
  }
}

bool split_env_on() {
  static const bool on = [] {
    const char* v = std::getenv("FERRY_PAGED_ATTN_SPLIT");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
bool aligned8(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 8 == 0; }

template <typename Elem>
void launch_paged_attention_elem(const PagedKvLayout& kv, int layer, const PagedStep& step,
                                 float* out, const float* q, int H, float scale, bool split,
                                 cudaStream_t stream) {
  if (split) {
    // One CTA per (token, head); D <= 128: 16 warps of one 4-element chunk per lane, else 8 of
    // two. (The caller checked the grid.)
    const unsigned grid = static_cast<unsigned>(step.T * H);
    if (kv.D <= 128) {
      launch_pdl(paged_attention_split_kernel<1, 16, Elem>, grid, 16 * 32, 0, stream, kv, layer,
                 step, out, q, H, scale);
    } else {
      launch_pdl(paged_attention_split_kernel<2, 8, Elem>, grid, 8 * 32, 0, stream, kv, layer, step,
                 out, q, H, scale);
    }
    return;
  }
  const std::int64_t warps = step.T * H;
  const unsigned grid = static_cast<unsigned>((warps * 32 + kThreads - 1) / kThreads);
  switch ((kv.D + 31) / 32) {
    case 1:
      launch_pdl(paged_attention_warp_kernel<1, Elem>, grid, kThreads, 0, stream, kv, layer, step,
                 out, q, H, scale);
      break;
    case 2:
      launch_pdl(paged_attention_warp_kernel<2, Elem>, grid, kThreads, 0, stream, kv, layer, step,
                 out, q, H, scale);
      break;
    case 3:
    case 4:
      launch_pdl(paged_attention_warp_kernel<4, Elem>, grid, kThreads, 0, stream, kv, layer, step,
                 out, q, H, scale);
      break;
    default:  // 5..8 (D <= 256, checked by the caller)
      launch_pdl(paged_attention_warp_kernel<8, Elem>, grid, kThreads, 0, stream, kv, layer, step,
                 out, q, H, scale);
      break;
  }
}

}  // namespace

cudaError_t launch_kv_write(const PagedKvLayout& kv, int layer, const PagedStep& step,
                            const float* k, const float* v, cudaStream_t stream) {
  if (step.T <= 0) return cudaSuccess;
  const unsigned grid = grid_for(step.T * kv.G * kv.D, 256);
  if (kv.bf16) {
    launch_pdl(kv_write_kernel<bf16>, grid, 256, 0, stream, kv, layer, step, k, v);
  } else {
    launch_pdl(kv_write_kernel<float>, grid, 256, 0, stream, kv, layer, step, k, v);
  }
  return cudaGetLastError();
}

cudaError_t launch_paged_attention(const PagedKvLayout& kv, int layer, const PagedStep& step,
                                   float* out, const float* q, int H, float scale,
                                   KernelVariant variant, cudaStream_t stream) {
  if (step.T <= 0) return cudaSuccess;
  const bool split_on =
      variant == KernelVariant::kDecode || (variant == KernelVariant::kDefault && split_env_on());
  const bool split = split_on && kv.D % 4 == 0 &&
                     (kv.bf16 ? aligned8(kv.base) : aligned16(kv.base)) && aligned16(out) &&
                     aligned16(q) && kv.layer_stride % 4 == 0;
  if (split && step.T * H > 0x7fffffff) return cudaErrorInvalidConfiguration;
  if (kv.bf16) {
    launch_paged_attention_elem<bf16>(kv, layer, step, out, q, H, scale, split, stream);
  } else {
    launch_paged_attention_elem<float>(kv, layer, step, out, q, H, scale, split, stream);
  }
  return cudaGetLastError();
}

}  // namespace ferry::kernels::cuda
