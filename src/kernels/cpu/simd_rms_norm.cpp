// SPDX-License-Identifier: Apache-2.0
// RMSNorm row kernels: AVX-512 and AVX2 bodies over whole 16-element blocks, one scalar
// function per stage for the tail and for CPUs without AVX2. Reductions keep 16 lanes (element
// i in lane i % 16) and combine them with the same halving tree in every variant, so all
// variants are bit-identical (simd_kernels.h). Checked against the reference backend in
// dense_cpu_vs_ref_test.cpp and across variants in simd_kernels_test.cpp.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/simd_kernels.h"

namespace ferry::kernels::cpu {
namespace {

constexpr std::int64_t kLanes = 16;

// ---- scalar stages (tails and fallback) ----

void square_accumulate(float* acc, const float* x, std::int64_t b, std::int64_t e) {
  for (std::int64_t i = b; i < e; ++i) acc[i % kLanes] += x[i] * x[i];
}
void dot3_accumulate(float* acc, const float* dy, const float* w, const float* x, std::int64_t b,
                     std::int64_t e) {
  for (std::int64_t i = b; i < e; ++i) acc[i % kLanes] += dy[i] * w[i] * x[i];
}
float reduce_lanes(float* acc) {
  for (std::int64_t step = kLanes / 2; step >= 1; step /= 2)
    for (std::int64_t j = 0; j < step; ++j) acc[j] += acc[j + step];
  return acc[0];
}
void scale_span(float* out, const float* in, const float* w, float rstd, std::int64_t b,
                std::int64_t e) {
  for (std::int64_t i = b; i < e; ++i) out[i] = in[i] * rstd * w[i];
}
void backward_span(float* d_in, const float* dy, const float* x, const float* w, float rstd,
                   float k, std::int64_t b, std::int64_t e) {
  for (std::int64_t i = b; i < e; ++i) d_in[i] = rstd * w[i] * dy[i] - x[i] * k;
}

float finish_rstd(float* acc, std::int64_t c, float eps) {
  const float ss = reduce_lanes(acc);
  return 1.0f / std::sqrt(ss / static_cast<float>(c) + eps);
}
float finish_k(float* acc, float rstd, std::int64_t c) {
  const float dot = reduce_lanes(acc);
  return rstd * rstd * rstd / static_cast<float>(c) * dot;
}

// ---- AVX2: two 8-wide accumulators make the 16 lanes ----

__attribute__((target("avx2,fma"))) std::int64_t square_accumulate_avx2(float* acc, const float* x,
                                                                        std::int64_t c) {
  const std::int64_t body = c / kLanes * kLanes;
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < body; i += kLanes) {
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
    a0 = _mm256_add_ps(a0, _mm256_mul_ps(x0, x0));
    a1 = _mm256_add_ps(a1, _mm256_mul_ps(x1, x1));
  }
  _mm256_storeu_ps(acc, a0);
  _mm256_storeu_ps(acc + 8, a1);
  return body;
}

__attribute__((target("avx2,fma"))) float rms_norm_row_avx2(float* out, const float* in,
                                                            const float* w, std::int64_t c,
                                                            float eps) {
  alignas(64) float acc[kLanes];
  const std::int64_t body = square_accumulate_avx2(acc, in, c);
  square_accumulate(acc, in, body, c);
  const float rstd = finish_rstd(acc, c, eps);
  const __m256 r = _mm256_set1_ps(rstd);
  const std::int64_t body8 = c / 8 * 8;
  for (std::int64_t i = 0; i < body8; i += 8) {
    const __m256 y =
        _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(in + i), r), _mm256_loadu_ps(w + i));
    _mm256_storeu_ps(out + i, y);
  }
  scale_span(out, in, w, rstd, body8, c);
  return rstd;
}

__attribute__((target("avx2,fma"))) void rms_norm_backward_row_avx2(float* d_in, const float* dy,
                                                                    const float* x, const float* w,
                                                                    float rstd, std::int64_t c) {
  alignas(64) float acc[kLanes];
  const std::int64_t body = c / kLanes * kLanes;
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < body; i += kLanes) {
    const __m256 t0 = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(dy + i), _mm256_loadu_ps(w + i)),
                                    _mm256_loadu_ps(x + i));
    const __m256 t1 =
        _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(dy + i + 8), _mm256_loadu_ps(w + i + 8)),
                      _mm256_loadu_ps(x + i + 8));
    a0 = _mm256_add_ps(a0, t0);
    a1 = _mm256_add_ps(a1, t1);
  }
  _mm256_storeu_ps(acc, a0);
  _mm256_storeu_ps(acc + 8, a1);
  dot3_accumulate(acc, dy, w, x, body, c);
  const float k = finish_k(acc, rstd, c);
  const __m256 r = _mm256_set1_ps(rstd), kv = _mm256_set1_ps(k);
  const std::int64_t body8 = c / 8 * 8;
  for (std::int64_t i = 0; i < body8; i += 8) {
    const __m256 a =
        _mm256_mul_ps(_mm256_mul_ps(r, _mm256_loadu_ps(w + i)), _mm256_loadu_ps(dy + i));
    const __m256 b = _mm256_mul_ps(_mm256_loadu_ps(x + i), kv);
    _mm256_storeu_ps(d_in + i, _mm256_sub_ps(a, b));
  }
  backward_span(d_in, dy, x, w, rstd, k, body8, c);
}

// ---- AVX-512: one 16-wide accumulator ----

__attribute__((target("avx512f"))) float rms_norm_row_avx512(float* out, const float* in,
                                                             const float* w, std::int64_t c,
                                                             float eps) {
  alignas(64) float acc[kLanes];
  const std::int64_t body = c / kLanes * kLanes;
  __m512 a = _mm512_setzero_ps();
  for (std::int64_t i = 0; i < body; i += kLanes) {
    const __m512 x = _mm512_loadu_ps(in + i);
    a = _mm512_add_ps(a, _mm512_mul_ps(x, x));
  }
  _mm512_storeu_ps(acc, a);
  square_accumulate(acc, in, body, c);
  const float rstd = finish_rstd(acc, c, eps);
  const __m512 r = _mm512_set1_ps(rstd);
  for (std::int64_t i = 0; i < body; i += kLanes) {
    const __m512 y =
        _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(in + i), r), _mm512_loadu_ps(w + i));
    _mm512_storeu_ps(out + i, y);
  }
  scale_span(out, in, w, rstd, body, c);
  return rstd;
}

__attribute__((target("avx512f"))) void rms_norm_backward_row_avx512(float* d_in, const float* dy,
                                                                     const float* x, const float* w,
                                                                     float rstd, std::int64_t c) {
  alignas(64) float acc[kLanes];
  const std::int64_t body = c / kLanes * kLanes;
  __m512 a = _mm512_setzero_ps();
  for (std::int64_t i = 0; i < body; i += kLanes) {
    const __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(dy + i), _mm512_loadu_ps(w + i)),
                                   _mm512_loadu_ps(x + i));
    a = _mm512_add_ps(a, t);
  }
  _mm512_storeu_ps(acc, a);
  dot3_accumulate(acc, dy, w, x, body, c);
  const float k = finish_k(acc, rstd, c);
  const __m512 r = _mm512_set1_ps(rstd), kv = _mm512_set1_ps(k);
  for (std::int64_t i = 0; i < body; i += kLanes) {
    const __m512 p =
        _mm512_mul_ps(_mm512_mul_ps(r, _mm512_loadu_ps(w + i)), _mm512_loadu_ps(dy + i));
    const __m512 q = _mm512_mul_ps(_mm512_loadu_ps(x + i), kv);
    _mm512_storeu_ps(d_in + i, _mm512_sub_ps(p, q));
  }
  backward_span(d_in, dy, x, w, rstd, k, body, c);
}

}  // namespace

float rms_norm_row(Isa isa, float* out, const float* in, const float* w, std::int64_t c,
                   float eps) {
  switch (isa) {
    case Isa::kAvx512:
      return rms_norm_row_avx512(out, in, w, c, eps);
    case Isa::kAvx2:
      return rms_norm_row_avx2(out, in, w, c, eps);
    case Isa::kScalar:
      break;
  }
  alignas(64) float acc[kLanes] = {};
  square_accumulate(acc, in, 0, c);
  const float rstd = finish_rstd(acc, c, eps);
  scale_span(out, in, w, rstd, 0, c);
  return rstd;
}

void rms_norm_backward_row(Isa isa, float* d_in, const float* dy, const float* x, const float* w,
                           float rstd, std::int64_t c) {
  switch (isa) {
    case Isa::kAvx512:
      return rms_norm_backward_row_avx512(d_in, dy, x, w, rstd, c);
    case Isa::kAvx2:
      return rms_norm_backward_row_avx2(d_in, dy, x, w, rstd, c);
    case Isa::kScalar:
      break;
  }
  alignas(64) float acc[kLanes] = {};
  dot3_accumulate(acc, dy, w, x, 0, c);
  const float k = finish_k(acc, rstd, c);
  backward_span(d_in, dy, x, w, rstd, k, 0, c);
}

}  // namespace ferry::kernels::cpu
