// SPDX-License-Identifier: Apache-2.0
// AVX-512 body of the hybrid AdamW kernel (hybrid_adamw.h): 16 lanes, the scalar twin
// (hybrid_adamw_scalar.h) for every tail. Each helper mirrors one scalar function of
// q8_code.h / hybrid_adamw_scalar.h operation for operation (no FMA: the target flags exclude
// it and ferry_kernels builds with -ffp-contract=off), which is what makes the variants
// bit-identical. Checked in tests/unit/train/hybrid_adamw_test.cpp.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

// NOTE(optim): GCC 12 at -O3 reports -Wmaybe-uninitialized inside avx512fintrin.h (its
// `__m512 __Y = __Y;` placeholder for _mm512_undefined_*), a known false positive that also hits
// simd_adamw.cpp; silence it for this file only so -Werror release builds stay usable.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "kernels/cpu/hybrid_adamw_scalar.h"
#include "kernels/cpu/hybrid_adamw_simd.h"

#define FERRY_T512 __attribute__((target("avx512f")))

namespace ferry::kernels::cpu::hybrid {
namespace {

struct C512 {
  __m512 gs, b1, b2, omb1, omb2, ibc1, ibc2, sqrt_ibc2, eps, wd, lr;
  __m512i key_lo, key_hi, iota;
};

FERRY_T512 inline C512 make_consts(const AdamWConstants& k, const HybridAdamWSpan& s) {
  return {_mm512_set1_ps(k.grad_scale),
          _mm512_set1_ps(k.beta1),
          _mm512_set1_ps(k.beta2),
          _mm512_set1_ps(k.one_minus_beta1),
          _mm512_set1_ps(k.one_minus_beta2),
          _mm512_set1_ps(k.inv_bc1),
          _mm512_set1_ps(k.inv_bc2),
          _mm512_set1_ps(std::sqrt(k.inv_bc2)),
          _mm512_set1_ps(k.eps),
          _mm512_set1_ps(k.weight_decay),
          _mm512_set1_ps(k.lr),
          _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(s.sr_key))),
          _mm512_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(s.sr_key >> 32))),
          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)};
}

FERRY_T512 inline __m512i i32(std::uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }

FERRY_T512 inline __m512 load_bf16(const std::uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

FERRY_T512 inline __m512 bf16_bits_to_f32(__m512i r) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(r, 16));
}

FERRY_T512 inline void store_bf16_bits(std::uint16_t* p, __m512i r) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}

// bf16_rne, result in the low 16 bits of each lane.
FERRY_T512 inline __m512i rne_bits(__m512 x) {
  const __m512i b = _mm512_castps_si512(x);
  const __mmask16 is_nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, i32(0x7fffffffu)), i32(0x7f800000u));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), i32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, i32(0x7fff))), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(b, 16), i32(0x40));
  return _mm512_mask_blend_epi32(is_nan, rounded, quiet);
}

FERRY_T512 inline __m512i mix32(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, i32(0x7feb352du));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, i32(0x846ca68bu));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

// bf16_sr with random_bits(index0 + i + lane).
FERRY_T512 inline __m512i sr_bits(const C512& c, __m512 f, std::uint32_t idx0) {
  const __m512i idx = _mm512_add_epi32(i32(idx0), c.iota);
  const __m512i h = _mm512_add_epi32(_mm512_mullo_epi32(idx, i32(0x9e3779b1u)), c.key_lo);
  const __m512i random = mix32(_mm512_xor_si512(mix32(h), c.key_hi));
  const __m512i b = _mm512_castps_si512(f);
  const __mmask16 special =
      _mm512_cmpeq_epi32_mask(_mm512_and_si512(b, i32(0x7f800000u)), i32(0x7f800000u));
  const __mmask16 is_nan =
      _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, i32(0x7fffffffu)), i32(0x7f800000u));
  const __m512i normal =
      _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_and_si512(random, i32(0xffffu))), 16);
  const __m512i top = _mm512_srli_epi32(b, 16);
  const __m512i kept = _mm512_mask_blend_epi32(is_nan, top, _mm512_or_si512(top, i32(0x40)));
  return _mm512_mask_blend_epi32(special, normal, kept);
}

template <MasterKind MK, bool kQ8 = false>
FERRY_T512 inline void step(const C512& c, const HybridAdamWSpan& s, std::int64_t i, __m512 mo,
                            __m512 vo, __m512& mi, __m512& vi, __m512* si = nullptr) {
  const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(s.grad + i), c.gs);
  mi = _mm512_add_ps(_mm512_mul_ps(c.b1, mo), _mm512_mul_ps(c.omb1, g));
  vi = _mm512_add_ps(_mm512_mul_ps(c.b2, vo), _mm512_mul_ps(c.omb2, _mm512_mul_ps(g, g)));
  __m512 denom;
  if constexpr (kQ8) {
    *si = _mm512_sqrt_ps(vi);
    denom = _mm512_add_ps(_mm512_mul_ps(*si, c.sqrt_ibc2), c.eps);
  } else {
    denom = _mm512_add_ps(_mm512_sqrt_ps(_mm512_mul_ps(vi, c.ibc2)), c.eps);
  }
  const __m512 adam = _mm512_div_ps(_mm512_mul_ps(mi, c.ibc1), denom);
  if constexpr (MK == MasterKind::kF32) {
    const __m512 p = _mm512_loadu_ps(s.p32 + i);
    const __m512 update = _mm512_add_ps(adam, _mm512_mul_ps(c.wd, p));
    const __m512 pn = _mm512_sub_ps(p, _mm512_mul_ps(c.lr, update));
    _mm512_storeu_ps(s.p32 + i, pn);
    if (s.p16 != nullptr) store_bf16_bits(s.p16 + i, rne_bits(pn));
  } else if constexpr (MK == MasterKind::kBf16Kahan) {
    const __m512 p = load_bf16(s.p16 + i);
    const __m512 comp = load_bf16(s.comp16 + i);
    const __m512 update = _mm512_add_ps(adam, _mm512_mul_ps(c.wd, p));
    const __m512 y = _mm512_sub_ps(comp, _mm512_mul_ps(c.lr, update));
    const __m512i t16 = rne_bits(_mm512_add_ps(p, y));
    const __m512 t = bf16_bits_to_f32(t16);
    store_bf16_bits(s.p16 + i, t16);
    store_bf16_bits(s.comp16 + i, rne_bits(_mm512_sub_ps(y, _mm512_sub_ps(t, p))));
    if (s.p32 != nullptr) _mm512_storeu_ps(s.p32 + i, t);
  } else {
    const __m512 p = load_bf16(s.p16 + i);
    const __m512 update = _mm512_add_ps(adam, _mm512_mul_ps(c.wd, p));
    const __m512 pn = _mm512_sub_ps(p, _mm512_mul_ps(c.lr, update));
    const __m512i w =
        sr_bits(c, pn, static_cast<std::uint32_t>(s.index0 + static_cast<std::uint64_t>(i)));
    store_bf16_bits(s.p16 + i, w);
    if (s.p32 != nullptr) _mm512_storeu_ps(s.p32 + i, bf16_bits_to_f32(w));
  }
}

// q8::encode_mag / decode_mag on 16 lanes.
template <int M>
FERRY_T512 inline __m512i encode_mag(__m512 y) {
  const __m512i b = _mm512_castps_si512(y);
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, i32((1u << (22 - M)) - 1u)),
                                     _mm512_and_si512(_mm512_srli_epi32(b, 23 - M), i32(1)));
  const __m512i code_n = _mm512_min_epi32(
      _mm512_sub_epi32(_mm512_srli_epi32(r, 23 - M), i32(112u << M)), i32(q8::kMaxCode<M>));
  const __mmask16 normal = _mm512_cmp_ps_mask(y, _mm512_set1_ps(q8::kMinNormal), _CMP_GE_OQ);
  if (normal == 0xffff) return code_n;  // the common case: skip the subnormal lanes' work
  __m512 t = _mm512_mul_ps(y, _mm512_set1_ps(q8::kSubScale<M>));
  t = _mm512_sub_ps(_mm512_add_ps(t, _mm512_set1_ps(8388608.0f)), _mm512_set1_ps(8388608.0f));
  const __m512i code_s = _mm512_cvttps_epi32(t);
  return _mm512_mask_blend_epi32(normal, code_s, code_n);
}

template <int M>
FERRY_T512 inline __m512 decode_mag(__m512i code) {
  const __m512 normal =
      _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(code, 23 - M), i32(112u << 23)));
  const __mmask16 is_sub = _mm512_cmplt_epi32_mask(code, i32(1u << M));
  if (is_sub == 0) return normal;
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(code), _mm512_set1_ps(q8::kSubStep<M>));
  return _mm512_mask_blend_ps(is_sub, normal, sub);
}

FERRY_T512 inline __m512i load_codes(const std::uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
FERRY_T512 inline void store_codes(std::uint8_t* p, __m512i c) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(c));
}

template <MasterKind MK>
FERRY_T512 void f32_states(const AdamWConstants& k, const HybridAdamWSpan& s) {
  const C512 c = make_consts(k, s);
  const std::int64_t body = s.n / 16 * 16;
  for (std::int64_t i = 0; i < body; i += 16) {
    __m512 mi, vi;
    step<MK>(c, s, i, _mm512_loadu_ps(s.m32 + i), _mm512_loadu_ps(s.v32 + i), mi, vi);
    _mm512_storeu_ps(s.m32 + i, mi);
    _mm512_storeu_ps(s.v32 + i, vi);
  }
  f32_states_range<MK>(k, s, body, s.n);
}

template <MasterKind MK>
FERRY_T512 void q8_states(const AdamWConstants& k, const HybridAdamWSpan& s) {
  const C512 c = make_consts(k, s);
  alignas(64) float scratch_m[q8::kBlock];
  alignas(64) float scratch_s[q8::kBlock];
  const __m512i abs_mask = i32(0x7fffffffu);
  std::int64_t blk = 0;
  for (std::int64_t b0 = 0; b0 < s.n; b0 += q8::kBlock, ++blk) {
    const std::int64_t b1 = std::min(s.n, b0 + q8::kBlock);
    const std::int64_t vend = b0 + (b1 - b0) / 16 * 16;
    const float deq_m = q8::decode_multiplier<q8::kMBits>(s.m_absmax[blk]);
    const float deq_s = q8::decode_multiplier<q8::kVBits>(s.v_absmax[blk]);
    const __m512 vdeq_m = _mm512_set1_ps(deq_m), vdeq_s = _mm512_set1_ps(deq_s);
    __m512 vamax_m = _mm512_setzero_ps(), vamax_s = _mm512_setzero_ps();
    for (std::int64_t i = b0; i < vend; i += 16) {
      const __m512i cm = load_codes(s.m8 + i);
      const __m512 mag =
          _mm512_mul_ps(decode_mag<q8::kMBits>(_mm512_and_si512(cm, i32(0x7f))), vdeq_m);
      const __m512 mo = _mm512_castsi512_ps(_mm512_or_si512(
          _mm512_castps_si512(mag), _mm512_slli_epi32(_mm512_and_si512(cm, i32(0x80)), 24)));
      const __m512 so = _mm512_mul_ps(decode_mag<q8::kVBits>(load_codes(s.v8 + i)), vdeq_s);
      __m512 mi, vi, si;
      step<MK, true>(c, s, i, mo, _mm512_mul_ps(so, so), mi, vi, &si);
      _mm512_store_ps(scratch_m + (i - b0), mi);
      _mm512_store_ps(scratch_s + (i - b0), si);
      vamax_m = _mm512_max_ps(
          vamax_m, _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(mi), abs_mask)));
      vamax_s = _mm512_max_ps(vamax_s, si);
    }
    float amax_m = _mm512_reduce_max_ps(vamax_m);
    float amax_s = _mm512_reduce_max_ps(vamax_s);
    q8_pass_a_range<MK>(k, s, b0, vend, b1, deq_m, deq_s, scratch_m, scratch_s, amax_m, amax_s);
    s.m_absmax[blk] = amax_m;
    s.v_absmax[blk] = amax_s;
    const float inv_m = q8::encode_multiplier<q8::kMBits>(amax_m);
    const float inv_s = q8::encode_multiplier<q8::kVBits>(amax_s);
    const __m512 vinv_m = _mm512_set1_ps(inv_m), vinv_s = _mm512_set1_ps(inv_s);
    for (std::int64_t i = b0; i < vend; i += 16) {
      prefetch_next_block<MK>(s, i + q8::kBlock);
      const __m512i b = _mm512_castps_si512(_mm512_load_ps(scratch_m + (i - b0)));
      const __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(b, 31), 7);
      const __m512 ym = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(b, abs_mask)), vinv_m);
      store_codes(s.m8 + i, _mm512_or_si512(encode_mag<q8::kMBits>(ym), sign));
      const __m512 ys = _mm512_mul_ps(_mm512_load_ps(scratch_s + (i - b0)), vinv_s);
      __m512i cs = encode_mag<q8::kVBits>(ys);
      const __mmask16 lift = _mm512_cmp_ps_mask(ys, _mm512_setzero_ps(), _CMP_GT_OQ) &
                             _mm512_cmpeq_epi32_mask(cs, _mm512_setzero_si512());
      cs = _mm512_mask_mov_epi32(cs, lift, i32(1));
      store_codes(s.v8 + i, cs);
    }
    q8_pass_b_range(s, b0, vend, b1, inv_m, inv_s, scratch_m, scratch_s);
  }
}

template <MasterKind MK>
void run_t(StateKind sk, const AdamWConstants& k, const HybridAdamWSpan& s) {
  if (sk == StateKind::kF32) return f32_states<MK>(k, s);
  return q8_states<MK>(k, s);
}

}  // namespace

void run_avx512(MasterKind mk, StateKind sk, const AdamWConstants& k, const HybridAdamWSpan& s) {
  switch (mk) {
    case MasterKind::kF32:
      return run_t<MasterKind::kF32>(sk, k, s);
    case MasterKind::kBf16Kahan:
      return run_t<MasterKind::kBf16Kahan>(sk, k, s);
    case MasterKind::kBf16Sr:
      return run_t<MasterKind::kBf16Sr>(sk, k, s);
  }
}

}  // namespace ferry::kernels::cpu::hybrid
