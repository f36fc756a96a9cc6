// SPDX-License-Identifier: Apache-2.0
// Rotary embedding, HF rotate_half layout, in place on x [T, H, D]. One thread per (token, pair i,
// group of kHeads heads) computes the angle position * inv_freq[i] and its sin/cos in f64
// (positions reach 1e5 and an f32 angle would lose ~1e-2 rad there), then rotates pair
// (i, i + R/2) of the group's heads.
// Tested in tests/gpu/kernels_dense_test.cpp. qk_norm_rope_kernel: Qwen3's per-head q/k norms and
// the rope in one launch (<false>), the bits of the separate launches (docs/cuda.md "Decode
// fusions"; tests/gpu/serve_decode_fusion_gpu_test.cpp); qk_norm_rope_kernel<true>: the same, plus
// the step's K/V rows into the paged KV cache (kv_write's bits, through paged_kv_row.cuh).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/paged_kv_row.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/serve_launchers.h"

namespace ferry::kernels::cuda {
namespace {

constexpr int kHeads = 4;

// The rotation of one pair (a, b) = (x[i], x[i + R/2]) by the angle's (cs, sn), shared by
// rope_kernel and qk_norm_rope_kernel so both compile the same expressions (the same bits).
__device__ __forceinline__ void rotate_pair(float a, float b, float cs, float sn, float& lo,
                                            float& hi) {
  lo = a * cs - b * sn;
  hi = b * cs + a * sn;
}

template <typename T>
__global__ void rope_kernel(T* __restrict__ x, const std::int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, std::int64_t t, std::int64_t h,
                            std::int64_t d, std::int64_t half, float scaling, bool backward) {
  pdl_wait();
  pdl_trigger();
  // A thread per (token, pair i, group of kHeads heads): the group's pairs are all loaded before
  // any is stored, so the loads overlap (one thread walking every head of a row serialized them
  // through possible aliasing: 9.6 us per decode-step launch on the H200, ncu, session 10). The
  // angle is computed once per thread; the arithmetic per element is unchanged.
  const std::int64_t groups = (h + kHeads - 1) / kHeads;
  const std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= t * half * groups) return;
  const std::int64_t i = idx % half, rest = idx / half;
  const std::int64_t tok = rest / groups, h0 = (rest % groups) * kHeads;
  double s, c;
  sincos(static_cast<double>(positions[tok]) * static_cast<double>(inv_freq[i]), &s, &c);
  const float cs = static_cast<float>(c) * scaling;
  const float sn = static_cast<float>(backward ? -s : s) * scaling;
  T* row = x + tok * h * d;
  float a[kHeads], b[kHeads];
#pragma unroll
  for (int u = 0; u < kHeads; ++u) {
    if (h0 + u < h) {
      const T* p = row + (h0 + u) * d;
      a[u] = to_f32(p[i]);
      b[u] = to_f32(p[i + half]);
    }
  }
#pragma unroll
  for (int u = 0; u < kHeads; ++u) {
    if (h0 + u < h) {
      T* p = row + (h0 + u) * d;
      float lo, hi;
      rotate_pair(a[u], b[u], cs, sn, lo, hi);
      p[i] = from_f32<T>(lo);
      p[i + half] = from_f32<T>(hi);
    }
  }
}

// Qwen3's q/k norms and rope in one launch (launch_qk_norm_rope_f32): a warp per head row, the q
// rows [t*h] then the k rows [t*g]. Each row is first rms_norm'd by rms_norm.cu's
// rms_norm_kernel<float, true> code (the kernel launch_rms_norm picks for rows of d % 4 == 0,
// d < 256, aligned: lanes sum float4 vectors lane, lane + 32, ... with fmaf in element order, the
// xor tree, rsqrtf(ss / d + eps), then x * r * w), stored, and then, after __syncwarp (the row's
// stores visible to the warp), each lane rotates pairs i = lane, lane + 32, ... < r/2 with
// rope_kernel's expressions (angle and sin/cos in f64, the same products and differences). Every
// output element is therefore the bits of the four separate launches.
struct QkRows {
  float* out;
  float* rstd;
  const float* in;
  const float* weight;
  std::int64_t heads;
};

// One head row of qk_norm_rope_kernel<false / true>, by one warp: the row `local` of
// s (token local / s.heads) normed into s.out, __syncwarp, then roped in place there. Both
// kernels call this one body, so they compile the same expressions (the same bits). Returns the
// row's output, which every lane may read after a further __syncwarp.
__device__ __forceinline__ float* qk_norm_rope_row(QkRows s, std::int64_t local, int lane,
                                                   const std::int32_t* __restrict__ positions,
                                                   const float* __restrict__ inv_freq,
                                                   std::int64_t d, std::int64_t half, float eps,
                                                   float scaling) {
  const std::int64_t tok = local / s.heads;
  const float4* xv = reinterpret_cast<const float4*>(s.in + local * d);
  float* y = s.out + local * d;
  const std::int64_t nv = d / 4;
  float ss = 0.0f;
  for (std::int64_t i = lane; i < nv; i += 32) {
    const float4 a = xv[i];
    ss = fmaf(a.x, a.x, ss);
    ss = fmaf(a.y, a.y, ss);
    ss = fmaf(a.z, a.z, ss);
    ss = fmaf(a.w, a.w, ss);
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(d) + eps);
  if (s.rstd != nullptr && lane == 0) s.rstd[local] = r;
  const float4* wv = reinterpret_cast<const float4*>(s.weight);
  float4* yv = reinterpret_cast<float4*>(y);
  for (std::int64_t i = lane; i < nv; i += 32) {
    const float4 a = xv[i], w = wv[i];
    yv[i] = make_float4(a.x * r * w.x, a.y * r * w.y, a.z * r * w.z, a.w * r * w.w);
  }
  __syncwarp();
  for (std::int64_t i = lane; i < half; i += 32) {
    double sn_d, cs_d;
    sincos(static_cast<double>(positions[tok]) * static_cast<double>(inv_freq[i]), &sn_d, &cs_d);
    const float cs = static_cast<float>(cs_d) * scaling;
    const float sn = static_cast<float>(sn_d) * scaling;
    float lo, hi;
    rotate_pair(y[i], y[i + half], cs, sn, lo, hi);
    y[i] = lo;
    y[i + half] = hi;
  }
  return y;
}

constexpr int kQkRowsPerBlock = 4;  // warps per 128-thread block, a head row each

// Where qk_norm_rope_kernel<true> writes the step's K/V rows: the paged cache of `layer`, and the
// v rows [t * g, d] beside the k rows it norms and ropes.
struct KvDest {
  PagedKvLayout kv;
  int layer = 0;
  PagedStep step;
  const float* v = nullptr;
};

// kWriteKv false: the norms and ropes only (launch_qk_norm_rope_f32). true: also, after
// __syncwarp (the rope's stores visible to every lane), a k row's warp copies its finished row
// and the v row of the same (token, kv head) into the paged cache at (seq_of[tok], pos[tok])
// through kv_row as kv_write_kernel does (f32 copies, or bf16 rounded to nearest even), so the
// cache holds kv_write's bits (decode fusion kQkNormRopeKv, decode_fusion.h).
template <bool kWriteKv>
__global__ void qk_norm_rope_kernel(QkRows q, QkRows k, const std::int32_t* __restrict__ positions,
                                    const float* __restrict__ inv_freq, std::int64_t t,
                                    std::int64_t d, std::int64_t half, float eps, float scaling,
                                    KvDest dest) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kQkRowsPerBlock + (threadIdx.x >> 5);
  const std::int64_t q_rows = t * q.heads;
  if (row >= q_rows + t * k.heads) return;
  const bool is_q = row < q_rows;
  const std::int64_t local = is_q ? row : row - q_rows;
  const float* y =
      qk_norm_rope_row(is_q ? q : k, local, lane, positions, inv_freq, d, half, eps, scaling);
  if constexpr (kWriteKv) {
    if (is_q) return;  // the whole warp: a warp owns one row
    __syncwarp();
    const std::int64_t tok = local / k.heads, head = local % k.heads;
    const std::int64_t j = dest.step.pos[tok];
    const float* vr = dest.v + local * d;
    const auto store = [&](auto tag) {
      using Elem = decltype(tag);
      Elem* kc = kv_row<Elem>(dest.kv, dest.layer, dest.step, tok, j, 0) + head * d;
      Elem* vc = kv_row<Elem>(dest.kv, dest.layer, dest.step, tok, j, 1) + head * d;
      for (std::int64_t i = lane; i < d; i += 32) {
        kc[i] = from_f32<Elem>(y[i]);
        vc[i] = from_f32<Elem>(vr[i]);
      }
    };
    if (dest.kv.bf16) {  // uniform
      store(bf16{});
    } else {
      store(float{});
    }
  } else {
    (void)y;
    (void)dest;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// rms_norm_kernel<float, true>'s domain in launch_rms_norm: 16-byte vectors, fewer than 64.
bool qk_norm_rope_supported(const QkNormRopeArgs& a) {
  return a.d % 4 == 0 && a.d >= 4 && a.d < 256 && a.r <= a.d && aligned16(a.q_out) &&
         aligned16(a.q_in) && aligned16(a.q_weight) && aligned16(a.k_out) && aligned16(a.k_in) &&
         aligned16(a.k_weight);
}

}  // namespace

cudaError_t launch_qk_norm_rope_f32(float* q_out, float* q_rstd, const float* q_in,
                                    const float* q_weight, float* k_out, float* k_rstd,
                                    const float* k_in, const float* k_weight,
                                    const std::int32_t* positions, const float* inv_freq,
                                    std::int64_t t, std::int64_t h, std::int64_t g, std::int64_t d,
                                    std::int64_t r, float eps, float scaling, cudaStream_t stream) {
  if (!qk_norm_rope_supported({.q_out = q_out,
                               .q_in = q_in,
                               .q_weight = q_weight,
                               .k_out = k_out,
                               .k_in = k_in,
                               .k_weight = k_weight,
                               .d = d,
                               .r = r})) {
    return cudaErrorNotSupported;
  }
  const std::int64_t rows = t * (h + g);
  if (rows == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((rows + kQkRowsPerBlock - 1) / kQkRowsPerBlock);
  launch_pdl(qk_norm_rope_kernel<false>, blocks, kQkRowsPerBlock * 32, 0, stream,
             QkRows{q_out, q_rstd, q_in, q_weight, h}, QkRows{k_out, k_rstd, k_in, k_weight, g},
             positions, inv_freq, t, d, r / 2, eps, scaling, KvDest{});
  return cudaGetLastError();
}

cudaError_t launch_qk_norm_rope_kv_f32(const QkNormRopeKvArgs& a, cudaStream_t stream) {
  const QkNormRopeArgs& p = a.qk;
  if (!qk_norm_rope_supported(p)) return cudaErrorNotSupported;
  const std::int64_t rows = p.t * (p.h + p.g);
  if (rows == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((rows + kQkRowsPerBlock - 1) / kQkRowsPerBlock);
  launch_pdl(qk_norm_rope_kernel<true>, blocks, kQkRowsPerBlock * 32, 0, stream,
             QkRows{p.q_out, p.q_rstd, p.q_in, p.q_weight, p.h},
             QkRows{p.k_out, p.k_rstd, p.k_in, p.k_weight, p.g}, p.positions, p.inv_freq, p.t, p.d,
             p.r / 2, p.eps, p.scaling,
             KvDest{.kv = a.kv, .layer = a.layer, .step = a.step, .v = a.v});
  return cudaGetLastError();
}

cudaError_t launch_rope(Elt e, void* x, const std::int32_t* positions, const float* inv_freq,
                        std::int64_t t, std::int64_t h, std::int64_t d, std::int64_t r,
                        float scaling, bool backward, cudaStream_t stream) {
  const std::int64_t half = r / 2;
  if (t == 0 || half == 0) return cudaSuccess;
  const std::int64_t groups = (h + kHeads - 1) / kHeads;
  const unsigned blocks = static_cast<unsigned>((t * half * groups + 127) / 128);
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    launch_pdl(rope_kernel<T>, blocks, 128, 0, stream, static_cast<T*>(x), positions, inv_freq, t,
               h, d, half, scaling, backward);
  });
}

}  // namespace ferry::kernels::cuda
