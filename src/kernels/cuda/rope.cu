// SPDX-License-Identifier: Apache-2.0
// Rotary embedding, HF rotate_half layout, in place on x [T, H, D]. One thread per (token, pair i,
// group of kHeads heads) computes the angle position * inv_freq[i] and its sin/cos in f64
// (positions reach 1e5 and an f32 angle would lose ~1e-2 rad there), then rotates pair
// (i, i + R/2) of the group's heads.
// Tested in tests/gpu/kernels_dense_test.cpp.
#include "kernels/cuda/common.cuh"

namespace ferry::kernels::cuda {
namespace {

constexpr int kHeads = 4;

template <typename T>
__global__ void rope_kernel(T* __restrict__ x, const std::int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, std::int64_t t, std::int64_t h,
                            std::int64_t d, std::int64_t half, float scaling, bool backward) {
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
      p[i] = from_f32<T>(a[u] * cs - b[u] * sn);
      p[i + half] = from_f32<T>(b[u] * cs + a[u] * sn);
    }
  }
}

}  // namespace

cudaError_t launch_rope(Elt e, void* x, const std::int32_t* positions, const float* inv_freq,
                        std::int64_t t, std::int64_t h, std::int64_t d, std::int64_t r,
                        float scaling, bool backward, cudaStream_t stream) {
  const std::int64_t half = r / 2;
  if (t == 0 || half == 0) return cudaSuccess;
  const std::int64_t groups = (h + kHeads - 1) / kHeads;
  const unsigned blocks = static_cast<unsigned>((t * half * groups + 127) / 128);
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<blocks, 128, 0, stream>>>(static_cast<T*>(x), positions, inv_freq, t, h, d,
                                               half, scaling, backward);
  });
}

}  // namespace ferry::kernels::cuda
