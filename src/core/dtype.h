// SPDX-License-Identifier: Apache-2.0
// Element types and their conversions. Narrowing float conversions round to nearest, ties to even
// (what PyTorch and the hardware do); NaN stays NaN (quiet), overflow goes to infinity.
// Tested in tests/unit/core/dtype_test.cpp against exhaustive/edge-case expectations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace ferry {

enum class DType : std::uint8_t { kF32, kF64, kBF16, kF16, kI8, kU8, kI32, kI64, kBool };

std::size_t dtype_size(DType dt);
std::string_view to_string(DType dt);
// Parses the safetensors spelling ("F32", "BF16", "I64", ...). nullopt when unknown.
std::optional<DType> dtype_from_safetensors(std::string_view name);
std::string_view to_safetensors(DType dt);
bool is_float(DType dt);

// bf16 and f16 are stored as raw 16-bit patterns.
struct BF16 {
  std::uint16_t bits;
};
struct F16 {
  std::uint16_t bits;
};

inline float bits_to_f32(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline std::uint32_t f32_to_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline float bf16_to_f32(std::uint16_t h) { return bits_to_f32(std::uint32_t{h} << 16); }

// Round to nearest even; NaN -> quiet NaN with the sign kept.
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t b = f32_to_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((b >> 16) | 0x0040u);
  const std::uint32_t lsb = (b >> 16) & 1u;
  b += 0x7fffu + lsb;
  return static_cast<std::uint16_t>(b >> 16);
}

float f16_to_f32(std::uint16_t h);
std::uint16_t f32_to_f16(float f);

// Converts n elements between any two float types (f32, f64, bf16, f16) or equal types.
// Integer types convert only to themselves. Returns false when the pair is unsupported.
bool convert_elements(const void* src, DType src_dt, void* dst, DType dst_dt, std::size_t n);

}  // namespace ferry
