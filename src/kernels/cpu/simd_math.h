// SPDX-License-Identifier: Apache-2.0
// Shared math for the SIMD bodies, in three bit-identical forms (scalar, AVX2, AVX-512):
//   exp_f32: exp(x) = 2^n * p(r), n = round_even(x log2 e), r = x - n ln2 (ln2 split in a
//     short-mantissa high part and a low part so n * hi is exact), p = Taylor series of degree 7
//     (truncation r^8/8! < 5.2e-9 for |r| <= ln2/2, below f32 resolution). x is clamped to
//     [-87.33, 88.37] so 2^n stays a normal float.
//   bf16 rounding: round to nearest even on the bit pattern, NaN kept quiet (core/dtype.h).
// Only included by cpu/simd_*.cpp; the target attributes keep the build flags generic.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ferry::kernels::cpu::simd {

inline constexpr float kExpLo = -87.33654f;
inline constexpr float kExpHi = 88.37626f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;     // 8 significant bits: n * kLn2Hi is exact
inline constexpr float kLn2Lo = -2.12194440e-4f;  // ln 2 - kLn2Hi
inline constexpr float kInvFact[8] = {1.0f,      1.0f,       0.5f,       1.0f / 6,
                                      1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};

inline float exp_f32(float x) {
  x = x < kExpLo ? kExpLo : x;  // clamp (same operand order as _mm*_max_ps / _mm*_min_ps)
  x = x > kExpHi ? kExpHi : x;
  const float n = std::nearbyint(x * kLog2e);  // default rounding mode: nearest even
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = kInvFact[7];
  for (int i = 6; i >= 0; --i) p = p * r + kInvFact[i];
  const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

inline float sigmoid_f32(float g) { return 1.0f / (1.0f + exp_f32(-g)); }

__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(kExpLo));
  x = _mm256_min_ps(x, _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Hi)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(kLn2Lo)));
  __m256 p = _mm256_set1_ps(kInvFact[7]);
  for (int i = 6; i >= 0; --i) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(kInvFact[i]));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

__attribute__((target("avx2,fma"))) inline __m256 sigmoid_avx2(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_div_ps(one, _mm256_add_ps(one, e));
}

__attribute__((target("avx512f"))) inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpLo));
  x = _mm512_min_ps(x, _mm512_set1_ps(kExpHi));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(kLn2Hi)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(kLn2Lo)));
  __m512 p = _mm512_set1_ps(kInvFact[7]);
  for (int i = 6; i >= 0; --i) p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(kInvFact[i]));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

__attribute__((target("avx512f"))) inline __m512 sigmoid_avx512(__m512 g) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_div_ps(one, _mm512_add_ps(one, e));
}

inline std::uint16_t bf16_round(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((b >> 16) | 0x0040u);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<std::uint16_t>(b >> 16);
}

// 8 floats -> 8 bf16 (same rule as bf16_round), stored unaligned.
__attribute__((target("avx2,fma"))) inline void store_bf16_avx2(std::uint16_t* dst, __m256 x) {
  const __m256i b = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
  // Pack the low 16 bits of 8 i32 lanes: packus saturates, so mask to 16 bits first (values are
  // already < 65536 after the shift) and fix the lane order after the in-lane pack.
  const __m256i packed = _mm256_packus_epi32(r, r);
  const __m256i ordered = _mm256_permute4x64_epi64(packed, 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(ordered));
}

// 16 floats -> 16 bf16.
__attribute__((target("avx512f"))) inline void store_bf16_avx512(std::uint16_t* dst, __m512 x) {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i abs = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
  const __m512i r = _mm512_mask_blend_epi32(is_nan, rounded, quiet);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(r));
}

}  // namespace ferry::kernels::cpu::simd
