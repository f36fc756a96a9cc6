// SPDX-License-Identifier: Apache-2.0
// AdamW span kernels (DeepSpeed cpu_adam shape): AVX-512 / AVX2 bodies over whole vectors and
// one scalar function for the tail and for CPUs without AVX2. Every variant does the same f32
// operations in the same order (no FMA), so results are bit-identical across variants; the
// optional bf16 copy rounds to nearest even like core/dtype.h's f32_to_bf16.
// Checked in adamw_step_test.cpp (hand-unrolled steps, reference backend, variants).
#include <immintrin.h>

// GCC 12 at -O3 reports -Wmaybe-uninitialized inside avx512fintrin.h (the `__m512 __Y = __Y;`
// placeholder behind _mm512_undefined_*), a known false positive that broke -Werror release
// builds (scripts/quickstart.sh); silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cmath>

#include "kernels/cpu/simd_kernels.h"
#include "kernels/cpu/simd_math.h"

namespace ferry::kernels::cpu {
namespace {

void adamw_scalar(const AdamWConstants& k, float* p, float* m, float* v, std::uint16_t* p_bf16,
                  const float* grad, std::int64_t b, std::int64_t e) {
  for (std::int64_t i = b; i < e; ++i) {
    const float g = grad[i] * k.grad_scale;
    const float mi = k.beta1 * m[i] + k.one_minus_beta1 * g;
    const float vi = k.beta2 * v[i] + k.one_minus_beta2 * (g * g);
    const float denom = std::sqrt(vi * k.inv_bc2) + k.eps;
    const float update = mi * k.inv_bc1 / denom + k.weight_decay * p[i];
    const float pi = p[i] - k.lr * update;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (p_bf16 != nullptr) p_bf16[i] = simd::bf16_round(pi);
  }
}

__attribute__((target("avx2,fma"))) void adamw_avx2(const AdamWConstants& k, float* p, float* m,
                                                    float* v, std::uint16_t* p_bf16,
                                                    const float* grad, std::int64_t n) {
  const std::int64_t body = n / 8 * 8;
  const __m256 gs = _mm256_set1_ps(k.grad_scale), b1 = _mm256_set1_ps(k.beta1),
               b2 = _mm256_set1_ps(k.beta2), omb1 = _mm256_set1_ps(k.one_minus_beta1),
               omb2 = _mm256_set1_ps(k.one_minus_beta2), ibc1 = _mm256_set1_ps(k.inv_bc1),
               ibc2 = _mm256_set1_ps(k.inv_bc2), eps = _mm256_set1_ps(k.eps),
               wd = _mm256_set1_ps(k.weight_decay), lr = _mm256_set1_ps(k.lr);
  for (std::int64_t i = 0; i < body; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), gs);
    const __m256 mi =
        _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(omb1, g));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                    _mm256_mul_ps(omb2, _mm256_mul_ps(g, g)));
    const __m256 denom = _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(vi, ibc2)), eps);
    const __m256 pv = _mm256_loadu_ps(p + i);
    const __m256 update =
        _mm256_add_ps(_mm256_div_ps(_mm256_mul_ps(mi, ibc1), denom), _mm256_mul_ps(wd, pv));
    const __m256 pi = _mm256_sub_ps(pv, _mm256_mul_ps(lr, update));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, pi);
    if (p_bf16 != nullptr) simd::store_bf16_avx2(p_bf16 + i, pi);
  }
  adamw_scalar(k, p, m, v, p_bf16, grad, body, n);
}

__attribute__((target("avx512f"))) void adamw_avx512(const AdamWConstants& k, float* p, float* m,
                                                     float* v, std::uint16_t* p_bf16,
                                                     const float* grad, std::int64_t n) {
  const std::int64_t body = n / 16 * 16;
  const __m512 gs = _mm512_set1_ps(k.grad_scale), b1 = _mm512_set1_ps(k.beta1),
               b2 = _mm512_set1_ps(k.beta2), omb1 = _mm512_set1_ps(k.one_minus_beta1),
               omb2 = _mm512_set1_ps(k.one_minus_beta2), ibc1 = _mm512_set1_ps(k.inv_bc1),
               ibc2 = _mm512_set1_ps(k.inv_bc2), eps = _mm512_set1_ps(k.eps),
               wd = _mm512_set1_ps(k.weight_decay), lr = _mm512_set1_ps(k.lr);
  for (std::int64_t i = 0; i < body; i += 16) {
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), gs);
    const __m512 mi =
        _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(omb1, g));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                    _mm512_mul_ps(omb2, _mm512_mul_ps(g, g)));
    const __m512 denom = _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(vi, ibc2)), eps);
    const __m512 pv = _mm512_loadu_ps(p + i);
    const __m512 update =
        _mm512_add_ps(_mm512_div_ps(_mm512_mul_ps(mi, ibc1), denom), _mm512_mul_ps(wd, pv));
    const __m512 pi = _mm512_sub_ps(pv, _mm512_mul_ps(lr, update));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(p + i, pi);
    if (p_bf16 != nullptr) simd::store_bf16_avx512(p_bf16 + i, pi);
  }
  adamw_scalar(k, p, m, v, p_bf16, grad, body, n);
}

}  // namespace

AdamWConstants make_adamw_constants(float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float grad_scale, std::int64_t step) {
  AdamWConstants k{};
  k.lr = lr;
  k.beta1 = beta1;
  k.beta2 = beta2;
  k.one_minus_beta1 = 1.0f - beta1;
  k.one_minus_beta2 = 1.0f - beta2;
  k.eps = eps;
  k.weight_decay = weight_decay;
  k.grad_scale = grad_scale;
  // Bias corrections in f64 (beta2^step for large step underflows gracefully), rounded once.
  const double s = static_cast<double>(step);
  k.inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), s)));
  k.inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), s)));
  return k;
}

void adamw_span(Isa isa, const AdamWConstants& k, float* p, float* m, float* v,
                std::uint16_t* p_bf16, const float* grad, std::int64_t n) {
  switch (isa) {
    case Isa::kAvx512:
      return adamw_avx512(k, p, m, v, p_bf16, grad, n);
    case Isa::kAvx2:
      return adamw_avx2(k, p, m, v, p_bf16, grad, n);
    case Isa::kScalar:
      return adamw_scalar(k, p, m, v, p_bf16, grad, 0, n);
  }
}

}  // namespace ferry::kernels::cpu
