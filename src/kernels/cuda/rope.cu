// SPDX-License-Identifier: Apache-2.0
// Rotary embedding, HF rotate_half layout, in place on x [T, H, D]. One thread per (token, pair i)
// computes the angle position * inv_freq[i] and its sin/cos in f64 (positions reach 1e5 and an f32
// angle would lose ~1e-2 rad there), then rotates pair (i, i + R/2) of every head.
// Tested in tests/gpu/kernels_dense_test.cpp.
#include "kernels/cuda/common.cuh"

namespace ferry::kernels::cuda {
namespace {

template <typename T>
__global__ void rope_kernel(T* __restrict__ x, const std::int32_t* __restrict__ positions,
                            const float* __restrict__ inv_freq, std::int64_t t, std::int64_t h,
                            std::int64_t d, std::int64_t half, float scaling, bool backward) {
  const std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= t * half) return;
  const std::int64_t tok = idx / half, i = idx % half;
  double s, c;
  sincos(static_cast<double>(positions[tok]) * static_cast<double>(inv_freq[i]), &s, &c);
  const float cs = static_cast<float>(c) * scaling;
  const float sn = static_cast<float>(backward ? -s : s) * scaling;
  T* row = x + tok * h * d;
  for (std::int64_t hh = 0; hh < h; ++hh) {
    T* p = row + hh * d;
    const float a = to_f32(p[i]), b = to_f32(p[i + half]);
    p[i] = from_f32<T>(a * cs - b * sn);
    p[i + half] = from_f32<T>(b * cs + a * sn);
  }
}

}  // namespace

cudaError_t launch_rope(Elt e, void* x, const std::int32_t* positions, const float* inv_freq,
                        std::int64_t t, std::int64_t h, std::int64_t d, std::int64_t r,
                        float scaling, bool backward, cudaStream_t stream) {
  const std::int64_t half = r / 2;
  if (t == 0 || half == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((t * half + 127) / 128);
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<blocks, 128, 0, stream>>>(static_cast<T*>(x), positions, inv_freq, t, h, d,
                                               half, scaling, backward);
  });
}

}  // namespace ferry::kernels::cuda
