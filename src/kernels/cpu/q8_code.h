// SPDX-License-Identifier: Apache-2.0
// The 8-bit codes of the block-wise AdamW states (docs/optimizer.md), in scalar form: this file
// is the specification that the AVX2 / AVX-512 bodies must reproduce bit for bit.
//
// Dynamic code, float-like: a value is stored as y = |x| * kMax / absmax(block) in an 8-bit
// mini-float with E = 4 exponent bits and M fraction bits, no infinities, gradual underflow:
//   e > 0:  y = 2^(e-15) * (1 + f / 2^M)        e = code >> M, f = code & (2^M - 1)
//   e = 0:  y = f * 2^-(14+M)                   (same spacing as the e = 1 binade)
// so every code is spaced at most 2^-M relative to its value over 16 binades (plus the
// subnormal step), which is bitsandbytes' dynamic-tree idea (exponent + fraction, resolution
// traded for range) with fixed field widths so that encoding is a handful of integer operations
// on the f32 bit pattern (round to nearest even) instead of a search in a 256-entry table.
//   m:        sign bit + E4M3 magnitude (M = 3), kMax = 1.875, smallest step 2^-17 (= 7.6e-6)
//   sqrt(v):  unsigned E4M4 (M = 4), kMax = 1.9375, smallest step 2^-18; a positive value never
//             encodes to 0 (it takes the smallest code), so the AdamW denominator never collapses
//             to eps because of quantization.
// Error bounds (used by q8_code_test.cpp): within the normal range (y >= 2^-14) the encoded value
// is within 2^-(M+1) of y relative to y (6.25 % for m, 3.125 % for sqrt(v)); below it the error
// is at most 2^-(15+M) in y units.
// Inputs must be finite; y above kMax (f32 rounding of the block multiplier) clamps to kMax.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace ferry::kernels::cpu::q8 {

// Elements per block (one f32 absmax per block and state). NOTE(optim): 2048 keeps a block's
// working set (f32 grad + f32 master + two f32 scratch rows = 32 KiB) inside L1/L2 and the scale
// overhead at 2 * 4 / 2048 = 0.004 bytes/param; see docs/optimizer.md.
inline constexpr std::int64_t kBlock = 2048;

inline constexpr int kMBits = 3;  // fraction bits of m's magnitude
inline constexpr int kVBits = 4;  // fraction bits of sqrt(v)
inline constexpr float kMinNormal = 0x1p-14f;

template <int M>
inline constexpr float kMax = (2.0f - 1.0f / static_cast<float>(1 << M));  // e = 15, f = all ones
template <int M>
inline constexpr std::int32_t kMaxCode = (16 << M) - 1;
template <int M>
inline constexpr float kSubScale = static_cast<float>(1 << (14 + M));  // 2^(14+M), exact
template <int M>
inline constexpr float kSubStep = 1.0f / kSubScale<M>;  // 2^-(14+M), exact

// The functions below are shared verbatim with the CUDA twin (kernels/cuda/hybrid_adamw.cu).
FERRY_HOST_DEVICE inline std::uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
#endif
}
FERRY_HOST_DEVICE inline float float_of(std::uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, 4);
  return f;
#endif
}

// y >= 0, finite -> code in [0, kMaxCode<M>] (round to nearest even on the code grid).
template <int M>
FERRY_HOST_DEVICE inline std::int32_t encode_mag(float y) {
  if (y >= kMinNormal) {
    const std::uint32_t b = bits_of(y);
    const std::uint32_t r = b + ((1u << (22 - M)) - 1u) + ((b >> (23 - M)) & 1u);
    const auto code = static_cast<std::int32_t>(r >> (23 - M)) - (112 << M);
    return code < kMaxCode<M> ? code : kMaxCode<M>;
  }
  float t = y * kSubScale<M>;         // exact (power of two)
  t = (t + 8388608.0f) - 8388608.0f;  // round half to even to an integer (t < 2^(M+1))
  return static_cast<std::int32_t>(t);
}

template <int M>
FERRY_HOST_DEVICE FERRY_HOST_DEVICE inline float decode_mag(std::int32_t code) {
  if (code < (1 << M)) return static_cast<float>(code) * kSubStep<M>;
  return float_of((static_cast<std::uint32_t>(code) << (23 - M)) + (112u << 23));
}

// Per-block multipliers: encode y = |x| * inv, decode x = value * deq. An all-zero block has
// absmax 0: inv = 0 encodes everything to code 0, deq = 0 decodes it to 0.
template <int M>
FERRY_HOST_DEVICE inline float encode_multiplier(float absmax) {
  return absmax > 0.0f ? kMax<M> / absmax : 0.0f;
}
template <int M>
FERRY_HOST_DEVICE FERRY_HOST_DEVICE inline float decode_multiplier(float absmax) {
  return absmax / kMax<M>;
}

// m: bit 7 = sign of x, bits 6..0 = E4M3 magnitude.
FERRY_HOST_DEVICE inline std::uint8_t encode_m(float x, float inv) {
  const std::uint32_t sign = (bits_of(x) >> 31) << 7;
  const float y = float_of(bits_of(x) & 0x7fffffffu) * inv;
  return static_cast<std::uint8_t>(sign | static_cast<std::uint32_t>(encode_mag<kMBits>(y)));
}
FERRY_HOST_DEVICE inline float decode_m(std::uint8_t c, float deq) {
  const float mag = decode_mag<kMBits>(c & 0x7f) * deq;
  return float_of(bits_of(mag) | (static_cast<std::uint32_t>(c & 0x80) << 24));
}

// s = sqrt(v) >= 0: E4M4; s > 0 never encodes to 0.
FERRY_HOST_DEVICE inline std::uint8_t encode_s(float s, float inv) {
  const float y = s * inv;
  std::int32_t c = encode_mag<kVBits>(y);
  if (c == 0 && y > 0.0f) c = 1;
  return static_cast<std::uint8_t>(c);
}
FERRY_HOST_DEVICE inline float decode_s(std::uint8_t c, float deq) {
  return decode_mag<kVBits>(c) * deq;
}

}  // namespace ferry::kernels::cpu::q8
