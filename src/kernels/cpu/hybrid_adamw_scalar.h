// SPDX-License-Identifier: Apache-2.0
// The scalar twin of the hybrid AdamW kernel (hybrid_adamw.h): one element at a time, the
// reference every SIMD body must equal bit for bit, and the function those bodies use for their
// tails. Included by hybrid_adamw*.cpp and simd_hybrid_adamw_*.cpp, and by the CUDA twin
// kernels/cuda/hybrid_adamw.cu, which runs step_element and the q8 codes from this very source
// (FERRY_HOST_DEVICE) compiled without FMA contraction, so both sides round alike.
//
// Per element i (g = grad * grad_scale; mo, vo = old moments, decoded for kQ8):
//   m = b1 mo + (1-b1) g;  v = b2 vo + (1-b2) g g;  denom = sqrt(v inv_bc2) + eps
//   (kQ8: denom = sqrt(v) sqrt(inv_bc2) + eps, reusing the sqrt(v) that is stored — one square
//   root less per element; equal up to f32 rounding)
//   u = (m inv_bc1) / denom + wd p                     (p = the weight as f32)
//   kF32:       p' = p - lr u
//   kBf16Kahan: y = c - lr u; t = bf16(p + y); c' = bf16(y - (t - p)); p' = t
//               (t - p is exact in f32: both are bf16 values of close magnitude)
//   kBf16Sr:    p' = bf16_sr(p - lr u, random bits of element i)
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/host_device.h"
#include "kernels/cpu/hybrid_adamw.h"
#include "kernels/cpu/q8_code.h"

namespace ferry::kernels::cpu::hybrid {

FERRY_HOST_DEVICE inline float widen_bf16(std::uint16_t h) {
  return q8::float_of(std::uint32_t{h} << 16);
}

// Round to nearest even (core/dtype.h's rule; NaN stays a quiet NaN).
FERRY_HOST_DEVICE inline std::uint16_t bf16_rne(float f) {
  std::uint32_t b = q8::bits_of(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((b >> 16) | 0x0040u);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<std::uint16_t>(b >> 16);
}

// Stochastic rounding: add 16 random bits below bf16 precision to the magnitude, truncate. The
// result is the upper neighbour with probability (distance from the lower one) / ulp, so the
// rounding is unbiased. Infinities and NaNs are kept (NaN made quiet).
FERRY_HOST_DEVICE inline std::uint16_t bf16_sr(float f, std::uint32_t random) {
  const std::uint32_t b = q8::bits_of(f);
  if ((b & 0x7f800000u) == 0x7f800000u) {
    const std::uint32_t quiet = (b & 0x7fffffffu) > 0x7f800000u ? 0x40u : 0u;
    return static_cast<std::uint16_t>((b >> 16) | quiet);
  }
  return static_cast<std::uint16_t>((b + (random & 0xffffu)) >> 16);
}

// lowbias32 (a 32-bit integer finalizer): cheap in every SIMD width (xor, shift, 32-bit mullo).
FERRY_HOST_DEVICE inline std::uint32_t mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

FERRY_HOST_DEVICE inline std::uint32_t random_bits(std::uint32_t index, std::uint32_t key_lo,
                                                   std::uint32_t key_hi) {
  return mix32(mix32(index * 0x9e3779b1u + key_lo) ^ key_hi);
}

// Old moments -> new moments + master update of element i (the formula in the file header);
// with kQ8 also sqrt(v) in *si.
template <MasterKind MK, bool kQ8 = false>
FERRY_HOST_DEVICE inline void step_element(const AdamWConstants& k, const HybridAdamWSpan& s,
                                           std::int64_t i, float mo, float vo, float& mi, float& vi,
                                           float* si = nullptr) {
  const float g = s.grad[i] * k.grad_scale;
  mi = k.beta1 * mo + k.one_minus_beta1 * g;
  vi = k.beta2 * vo + k.one_minus_beta2 * (g * g);
  float denom;
  if constexpr (kQ8) {
    *si = std::sqrt(vi);
    denom = *si * std::sqrt(k.inv_bc2) + k.eps;
  } else {
    denom = std::sqrt(vi * k.inv_bc2) + k.eps;
  }
  if constexpr (MK == MasterKind::kF32) {
    const float p = s.p32[i];
    const float update = mi * k.inv_bc1 / denom + k.weight_decay * p;
    const float pn = p - k.lr * update;
    s.p32[i] = pn;
    if (s.p16 != nullptr) s.p16[i] = bf16_rne(pn);
  } else if constexpr (MK == MasterKind::kBf16Kahan) {
    const float p = widen_bf16(s.p16[i]);
    const float c = widen_bf16(s.comp16[i]);
    const float update = mi * k.inv_bc1 / denom + k.weight_decay * p;
    const float y = c - k.lr * update;
    const std::uint16_t t16 = bf16_rne(p + y);
    const float t = widen_bf16(t16);
    s.p16[i] = t16;
    s.comp16[i] = bf16_rne(y - (t - p));
    if (s.p32 != nullptr) s.p32[i] = t;
  } else {
    const float p = widen_bf16(s.p16[i]);
    const float update = mi * k.inv_bc1 / denom + k.weight_decay * p;
    const float pn = p - k.lr * update;
    const auto idx = static_cast<std::uint32_t>(s.index0 + static_cast<std::uint64_t>(i));
    const std::uint16_t w = bf16_sr(pn, random_bits(idx, static_cast<std::uint32_t>(s.sr_key),
                                                    static_cast<std::uint32_t>(s.sr_key >> 32)));
    s.p16[i] = w;
    if (s.p32 != nullptr) s.p32[i] = widen_bf16(w);
  }
}

// f32 states over [b, e).
template <MasterKind MK>
inline void f32_states_range(const AdamWConstants& k, const HybridAdamWSpan& s, std::int64_t b,
                             std::int64_t e) {
  for (std::int64_t i = b; i < e; ++i) {
    float mi, vi;
    step_element<MK>(k, s, i, s.m32[i], s.v32[i], mi, vi);
    s.m32[i] = mi;
    s.v32[i] = vi;
  }
}

// Pass A of one kQ8 block over [b, e) (block-relative scratch index i - base): decode, step,
// keep the new m and sqrt(v) in scratch and fold their magnitudes into the running maxima.
template <MasterKind MK>
inline void q8_pass_a_range(const AdamWConstants& k, const HybridAdamWSpan& s, std::int64_t base,
                            std::int64_t b, std::int64_t e, float deq_m, float deq_s,
                            float* scratch_m, float* scratch_s, float& amax_m, float& amax_s) {
  for (std::int64_t i = b; i < e; ++i) {
    const float mo = q8::decode_m(s.m8[i], deq_m);
    const float so = q8::decode_s(s.v8[i], deq_s);
    float mi, vi, si;
    step_element<MK, true>(k, s, i, mo, so * so, mi, vi, &si);
    scratch_m[i - base] = mi;
    scratch_s[i - base] = si;
    const float am = q8::float_of(q8::bits_of(mi) & 0x7fffffffu);
    amax_m = am > amax_m ? am : amax_m;
    amax_s = si > amax_s ? si : amax_s;
  }
}

// Pass B of a block touches only L1 scratch; the SIMD bodies call this once per 16 elements of it
// with j = the matching element of the next block, so that block's streams are on their way
// meanwhile (hints only: results do not change).
template <MasterKind MK>
inline void prefetch_next_block(const HybridAdamWSpan& s, std::int64_t j) {
  if (j >= s.n || (j & 15) != 0) return;
  __builtin_prefetch(s.grad + j);  // 16 f32 = one 64-byte line
  if constexpr (MK == MasterKind::kF32) {
    __builtin_prefetch(s.p32 + j, 1);
  } else if ((j & 31) == 0) {
    __builtin_prefetch(s.p16 + j, 1);
    if constexpr (MK == MasterKind::kBf16Kahan) __builtin_prefetch(s.comp16 + j, 1);
  }
  if ((j & 63) == 0) {
    __builtin_prefetch(s.m8 + j, 1);
    __builtin_prefetch(s.v8 + j, 1);
  }
}

// Pass B over [b, e): encode scratch with the new block multipliers.
inline void q8_pass_b_range(const HybridAdamWSpan& s, std::int64_t base, std::int64_t b,
                            std::int64_t e, float inv_m, float inv_s, const float* scratch_m,
                            const float* scratch_s) {
  for (std::int64_t i = b; i < e; ++i) {
    s.m8[i] = q8::encode_m(scratch_m[i - base], inv_m);
    s.v8[i] = q8::encode_s(scratch_s[i - base], inv_s);
  }
}

}  // namespace ferry::kernels::cpu::hybrid
