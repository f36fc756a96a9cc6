// SPDX-License-Identifier: Apache-2.0
// SwiGLU span kernels: AVX-512 / AVX2 bodies and the scalar function for tails and fallback.
// silu(g) = g * sig(g), sig(g) = 1 / (1 + exp(-g)) with simd_math.h's exp, identical bits in
// every variant. Gradient (see ref/): d_up = dy * silu(g), d_gate = dy * u * sig * (1 + g (1 -
// sig)).
#include <immintrin.h>

// GCC 12 -O3 false positive inside avx512fintrin.h; see simd_adamw.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "kernels/cpu/simd_kernels.h"
#include "kernels/cpu/simd_math.h"

namespace ferry::kernels::cpu {
namespace {

void swiglu_scalar(float* out, const float* g, const float* u, std::int64_t b, std::int64_t e) {
  for (std::int64_t i = b; i < e; ++i) out[i] = g[i] * simd::sigmoid_f32(g[i]) * u[i];
}

void swiglu_backward_scalar(float* d_gate, float* d_up, const float* dy, const float* g,
                            const float* u, std::int64_t b, std::int64_t e) {
  for (std::int64_t i = b; i < e; ++i) {
    const float s = simd::sigmoid_f32(g[i]);
    const float silu = g[i] * s;
    d_up[i] = dy[i] * silu;
    d_gate[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
}

__attribute__((target("avx2,fma"))) void swiglu_avx2(float* out, const float* g, const float* u,
                                                     std::int64_t n) {
  const std::int64_t body = n / 8 * 8;
  for (std::int64_t i = 0; i < body; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 y =
        _mm256_mul_ps(_mm256_mul_ps(gv, simd::sigmoid_avx2(gv)), _mm256_loadu_ps(u + i));
    _mm256_storeu_ps(out + i, y);
  }
  swiglu_scalar(out, g, u, body, n);
}

__attribute__((target("avx2,fma"))) void swiglu_backward_avx2(float* d_gate, float* d_up,
                                                              const float* dy, const float* g,
                                                              const float* u, std::int64_t n) {
  const std::int64_t body = n / 8 * 8;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (std::int64_t i = 0; i < body; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i), dyv = _mm256_loadu_ps(dy + i);
    const __m256 s = simd::sigmoid_avx2(gv);
    _mm256_storeu_ps(d_up + i, _mm256_mul_ps(dyv, _mm256_mul_ps(gv, s)));
    const __m256 inner = _mm256_add_ps(one, _mm256_mul_ps(gv, _mm256_sub_ps(one, s)));
    const __m256 dg =
        _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(dyv, _mm256_loadu_ps(u + i)), s), inner);
    _mm256_storeu_ps(d_gate + i, dg);
  }
  swiglu_backward_scalar(d_gate, d_up, dy, g, u, body, n);
}

__attribute__((target("avx512f"))) void swiglu_avx512(float* out, const float* g, const float* u,
                                                      std::int64_t n) {
  const std::int64_t body = n / 16 * 16;
  for (std::int64_t i = 0; i < body; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i);
    const __m512 y =
        _mm512_mul_ps(_mm512_mul_ps(gv, simd::sigmoid_avx512(gv)), _mm512_loadu_ps(u + i));
    _mm512_storeu_ps(out + i, y);
  }
  swiglu_scalar(out, g, u, body, n);
}

__attribute__((target("avx512f"))) void swiglu_backward_avx512(float* d_gate, float* d_up,
                                                               const float* dy, const float* g,
                                                               const float* u, std::int64_t n) {
  const std::int64_t body = n / 16 * 16;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (std::int64_t i = 0; i < body; i += 16) {
    const __m512 gv = _mm512_loadu_ps(g + i), dyv = _mm512_loadu_ps(dy + i);
    const __m512 s = simd::sigmoid_avx512(gv);
    _mm512_storeu_ps(d_up + i, _mm512_mul_ps(dyv, _mm512_mul_ps(gv, s)));
    const __m512 inner = _mm512_add_ps(one, _mm512_mul_ps(gv, _mm512_sub_ps(one, s)));
    const __m512 dg =
        _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(dyv, _mm512_loadu_ps(u + i)), s), inner);
    _mm512_storeu_ps(d_gate + i, dg);
  }
  swiglu_backward_scalar(d_gate, d_up, dy, g, u, body, n);
}

}  // namespace

void swiglu_span(Isa isa, float* out, const float* g, const float* u, std::int64_t n) {
  switch (isa) {
    case Isa::kAvx512:
      return swiglu_avx512(out, g, u, n);
    case Isa::kAvx2:
      return swiglu_avx2(out, g, u, n);
    case Isa::kScalar:
      return swiglu_scalar(out, g, u, 0, n);
  }
}

void swiglu_backward_span(Isa isa, float* d_gate, float* d_up, const float* dy, const float* g,
                          const float* u, std::int64_t n) {
  switch (isa) {
    case Isa::kAvx512:
      return swiglu_backward_avx512(d_gate, d_up, dy, g, u, n);
    case Isa::kAvx2:
      return swiglu_backward_avx2(d_gate, d_up, dy, g, u, n);
    case Isa::kScalar:
      return swiglu_backward_scalar(d_gate, d_up, dy, g, u, 0, n);
  }
}

}  // namespace ferry::kernels::cpu
