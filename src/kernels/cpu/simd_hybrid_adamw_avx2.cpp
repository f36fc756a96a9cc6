// SPDX-License-Identifier: Apache-2.0
// AVX2 body of the hybrid AdamW kernel (hybrid_adamw.h): 8 lanes, the scalar twin
// (hybrid_adamw_scalar.h) for every tail; the same helper-for-helper mirror of the scalar code
// as simd_hybrid_adamw_avx512.cpp (no FMA, same operation order), hence bit-identical results.
// Checked in tests/unit/train/hybrid_adamw_test.cpp.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/hybrid_adamw_scalar.h"
#include "kernels/cpu/hybrid_adamw_simd.h"

#define FERRY_T256 __attribute__((target("avx2")))

namespace ferry::kernels::cpu::hybrid {
namespace {

struct C256 {
  __m256 gs, b1, b2, omb1, omb2, ibc1, ibc2, sqrt_ibc2, eps, wd, lr;
  __m256i key_lo, key_hi, iota;
};

FERRY_T256 inline C256 make_consts(const AdamWConstants& k, const HybridAdamWSpan& s) {
  return {_mm256_set1_ps(k.grad_scale),
          _mm256_set1_ps(k.beta1),
          _mm256_set1_ps(k.beta2),
          _mm256_set1_ps(k.one_minus_beta1),
          _mm256_set1_ps(k.one_minus_beta2),
          _mm256_set1_ps(k.inv_bc1),
          _mm256_set1_ps(k.inv_bc2),
          _mm256_set1_ps(std::sqrt(k.inv_bc2)),
          _mm256_set1_ps(k.eps),
          _mm256_set1_ps(k.weight_decay),
          _mm256_set1_ps(k.lr),
          _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(s.sr_key))),
          _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(s.sr_key >> 32))),
          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)};
}

FERRY_T256 inline __m256i i32(std::uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }

FERRY_T256 inline __m256i select(__m256i a, __m256i b, __m256i mask) {  // mask ? b : a
  return _mm256_blendv_epi8(a, b, mask);
}

FERRY_T256 inline __m256 load_bf16(const std::uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

FERRY_T256 inline __m256 bf16_bits_to_f32(__m256i r) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(r, 16));
}

// 8 lanes holding values < 2^16 -> 8 uint16 (packus does not saturate them).
FERRY_T256 inline void store_bf16_bits(std::uint16_t* p, __m256i r) {
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

FERRY_T256 inline __m256i rne_bits(__m256 x) {
  const __m256i b = _mm256_castps_si256(x);
  const __m256i is_nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(b, i32(0x7fffffffu)), i32(0x7f800000u));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), i32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, i32(0x7fff))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), i32(0x40));
  return select(rounded, quiet, is_nan);
}

FERRY_T256 inline __m256i mix32(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, i32(0x7feb352du));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, i32(0x846ca68bu));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

FERRY_T256 inline __m256i sr_bits(const C256& c, __m256 f, std::uint32_t idx0) {
  const __m256i idx = _mm256_add_epi32(i32(idx0), c.iota);
  const __m256i h = _mm256_add_epi32(_mm256_mullo_epi32(idx, i32(0x9e3779b1u)), c.key_lo);
  const __m256i random = mix32(_mm256_xor_si256(mix32(h), c.key_hi));
  const __m256i b = _mm256_castps_si256(f);
  const __m256i special =
      _mm256_cmpeq_epi32(_mm256_and_si256(b, i32(0x7f800000u)), i32(0x7f800000u));
  const __m256i is_nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(b, i32(0x7fffffffu)), i32(0x7f800000u));
  const __m256i normal =
      _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_and_si256(random, i32(0xffffu))), 16);
  const __m256i top = _mm256_srli_epi32(b, 16);
  const __m256i kept = select(top, _mm256_or_si256(top, i32(0x40)), is_nan);
  return select(normal, kept, special);
}

template <MasterKind MK, bool kQ8 = false>
FERRY_T256 inline void step(const C256& c, const HybridAdamWSpan& s, std::int64_t i, __m256 mo,
                            __m256 vo, __m256& mi, __m256& vi, __m256* si = nullptr) {
  const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(s.grad + i), c.gs);
  mi = _mm256_add_ps(_mm256_mul_ps(c.b1, mo), _mm256_mul_ps(c.omb1, g));
  vi = _mm256_add_ps(_mm256_mul_ps(c.b2, vo), _mm256_mul_ps(c.omb2, _mm256_mul_ps(g, g)));
  __m256 denom;
  if constexpr (kQ8) {
    *si = _mm256_sqrt_ps(vi);
    denom = _mm256_add_ps(_mm256_mul_ps(*si, c.sqrt_ibc2), c.eps);
  } else {
    denom = _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(vi, c.ibc2)), c.eps);
  }
  const __m256 adam = _mm256_div_ps(_mm256_mul_ps(mi, c.ibc1), denom);
  if constexpr (MK == MasterKind::kF32) {
    const __m256 p = _mm256_loadu_ps(s.p32 + i);
    const __m256 update = _mm256_add_ps(adam, _mm256_mul_ps(c.wd, p));
    const __m256 pn = _mm256_sub_ps(p, _mm256_mul_ps(c.lr, update));
    _mm256_storeu_ps(s.p32 + i, pn);
    if (s.p16 != nullptr) store_bf16_bits(s.p16 + i, rne_bits(pn));
  } else if constexpr (MK == MasterKind::kBf16Kahan) {
    const __m256 p = load_bf16(s.p16 + i);
    const __m256 comp = load_bf16(s.comp16 + i);
    const __m256 update = _mm256_add_ps(adam, _mm256_mul_ps(c.wd, p));
    const __m256 y = _mm256_sub_ps(comp, _mm256_mul_ps(c.lr, update));
    const __m256i t16 = rne_bits(_mm256_add_ps(p, y));
    const __m256 t = bf16_bits_to_f32(t16);
    store_bf16_bits(s.p16 + i, t16);
    store_bf16_bits(s.comp16 + i, rne_bits(_mm256_sub_ps(y, _mm256_sub_ps(t, p))));
    if (s.p32 != nullptr) _mm256_storeu_ps(s.p32 + i, t);
  } else {
    const __m256 p = load_bf16(s.p16 + i);
    const __m256 update = _mm256_add_ps(adam, _mm256_mul_ps(c.wd, p));
    const __m256 pn = _mm256_sub_ps(p, _mm256_mul_ps(c.lr, update));
    const __m256i w =
        sr_bits(c, pn, static_cast<std::uint32_t>(s.index0 + static_cast<std::uint64_t>(i)));
    store_bf16_bits(s.p16 + i, w);
    if (s.p32 != nullptr) _mm256_storeu_ps(s.p32 + i, bf16_bits_to_f32(w));
  }
}

template <int M>
FERRY_T256 inline __m256i encode_mag(__m256 y) {
  const __m256i b = _mm256_castps_si256(y);
  const __m256i r = _mm256_add_epi32(_mm256_add_epi32(b, i32((1u << (22 - M)) - 1u)),
                                     _mm256_and_si256(_mm256_srli_epi32(b, 23 - M), i32(1)));
  const __m256i code_n = _mm256_min_epi32(
      _mm256_sub_epi32(_mm256_srli_epi32(r, 23 - M), i32(112u << M)), i32(q8::kMaxCode<M>));
  const __m256 normal_ps = _mm256_cmp_ps(y, _mm256_set1_ps(q8::kMinNormal), _CMP_GE_OQ);
  if (_mm256_movemask_ps(normal_ps) == 0xff) return code_n;  // common case: no subnormal lane
  __m256 t = _mm256_mul_ps(y, _mm256_set1_ps(q8::kSubScale<M>));
  t = _mm256_sub_ps(_mm256_add_ps(t, _mm256_set1_ps(8388608.0f)), _mm256_set1_ps(8388608.0f));
  const __m256i code_s = _mm256_cvttps_epi32(t);
  return select(code_s, code_n, _mm256_castps_si256(normal_ps));
}

template <int M>
FERRY_T256 inline __m256 decode_mag(__m256i code) {
  const __m256 normal =
      _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(code, 23 - M), i32(112u << 23)));
  const __m256i is_sub = _mm256_cmpgt_epi32(i32(1u << M), code);
  if (_mm256_testz_si256(is_sub, is_sub)) return normal;
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(code), _mm256_set1_ps(q8::kSubStep<M>));
  return _mm256_blendv_ps(normal, sub, _mm256_castsi256_ps(is_sub));
}

FERRY_T256 inline __m256i load_codes(const std::uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// 8 lanes holding values < 256 -> 8 bytes.
FERRY_T256 inline void store_codes(std::uint8_t* p, __m256i c) {
  const __m256i shuf =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i bytes = _mm256_shuffle_epi8(c, shuf);
  const __m128i both =
      _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), both);
}

FERRY_T256 inline float hmax(__m256 x) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

template <MasterKind MK>
FERRY_T256 void f32_states(const AdamWConstants& k, const HybridAdamWSpan& s) {
  const C256 c = make_consts(k, s);
  const std::int64_t body = s.n / 8 * 8;
  for (std::int64_t i = 0; i < body; i += 8) {
    __m256 mi, vi;
    step<MK>(c, s, i, _mm256_loadu_ps(s.m32 + i), _mm256_loadu_ps(s.v32 + i), mi, vi);
    _mm256_storeu_ps(s.m32 + i, mi);
    _mm256_storeu_ps(s.v32 + i, vi);
  }
  f32_states_range<MK>(k, s, body, s.n);
}

template <MasterKind MK>
FERRY_T256 void q8_states(const AdamWConstants& k, const HybridAdamWSpan& s) {
  const C256 c = make_consts(k, s);
  alignas(32) float scratch_m[q8::kBlock];
  alignas(32) float scratch_s[q8::kBlock];
  const __m256i abs_mask = i32(0x7fffffffu);
  std::int64_t blk = 0;
  for (std::int64_t b0 = 0; b0 < s.n; b0 += q8::kBlock, ++blk) {
    const std::int64_t b1 = std::min(s.n, b0 + q8::kBlock);
    const std::int64_t vend = b0 + (b1 - b0) / 8 * 8;
    const float deq_m = q8::decode_multiplier<q8::kMBits>(s.m_absmax[blk]);
    const float deq_s = q8::decode_multiplier<q8::kVBits>(s.v_absmax[blk]);
    const __m256 vdeq_m = _mm256_set1_ps(deq_m), vdeq_s = _mm256_set1_ps(deq_s);
    __m256 vamax_m = _mm256_setzero_ps(), vamax_s = _mm256_setzero_ps();
    for (std::int64_t i = b0; i < vend; i += 8) {
      const __m256i cm = load_codes(s.m8 + i);
      const __m256 mag =
          _mm256_mul_ps(decode_mag<q8::kMBits>(_mm256_and_si256(cm, i32(0x7f))), vdeq_m);
      const __m256 mo = _mm256_castsi256_ps(_mm256_or_si256(
          _mm256_castps_si256(mag), _mm256_slli_epi32(_mm256_and_si256(cm, i32(0x80)), 24)));
      const __m256 so = _mm256_mul_ps(decode_mag<q8::kVBits>(load_codes(s.v8 + i)), vdeq_s);
      __m256 mi, vi, si;
      step<MK, true>(c, s, i, mo, _mm256_mul_ps(so, so), mi, vi, &si);
      _mm256_store_ps(scratch_m + (i - b0), mi);
      _mm256_store_ps(scratch_s + (i - b0), si);
      vamax_m = _mm256_max_ps(
          vamax_m, _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(mi), abs_mask)));
      vamax_s = _mm256_max_ps(vamax_s, si);
    }
    float amax_m = hmax(vamax_m);
    float amax_s = hmax(vamax_s);
    q8_pass_a_range<MK>(k, s, b0, vend, b1, deq_m, deq_s, scratch_m, scratch_s, amax_m, amax_s);
    s.m_absmax[blk] = amax_m;
    s.v_absmax[blk] = amax_s;
    const float inv_m = q8::encode_multiplier<q8::kMBits>(amax_m);
    const float inv_s = q8::encode_multiplier<q8::kVBits>(amax_s);
    const __m256 vinv_m = _mm256_set1_ps(inv_m), vinv_s = _mm256_set1_ps(inv_s);
    for (std::int64_t i = b0; i < vend; i += 8) {
      prefetch_next_block<MK>(s, i + q8::kBlock);
      const __m256i b = _mm256_castps_si256(_mm256_load_ps(scratch_m + (i - b0)));
      const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(b, 31), 7);
      const __m256 ym = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(b, abs_mask)), vinv_m);
      store_codes(s.m8 + i, _mm256_or_si256(encode_mag<q8::kMBits>(ym), sign));
      const __m256 ys = _mm256_mul_ps(_mm256_load_ps(scratch_s + (i - b0)), vinv_s);
      __m256i cs = encode_mag<q8::kVBits>(ys);
      const __m256i lift =
          _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(ys, _mm256_setzero_ps(), _CMP_GT_OQ)),
                           _mm256_cmpeq_epi32(cs, _mm256_setzero_si256()));
      cs = select(cs, i32(1), lift);
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

void run_avx2(MasterKind mk, StateKind sk, const AdamWConstants& k, const HybridAdamWSpan& s) {
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
