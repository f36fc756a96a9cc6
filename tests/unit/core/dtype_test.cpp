// SPDX-License-Identifier: Apache-2.0
#include "core/dtype.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace ferry {
namespace {

// Reference: round-to-nearest-even computed with exact double arithmetic over neighbours.
std::uint16_t bf16_reference(float f) {
  const std::uint32_t b = f32_to_bits(f);
  const std::uint16_t lo = static_cast<std::uint16_t>(b >> 16);
  const std::uint16_t hi = static_cast<std::uint16_t>(lo + 1);
  const double x = f, a = bf16_to_f32(lo), c = bf16_to_f32(hi);
  const double da = std::fabs(x - a), dc = std::fabs(c - x);
  if (da < dc) return lo;
  if (dc < da) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(DType, Bf16RoundsToNearestEvenOnSweep) {
  std::uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    const std::uint32_t bits = state & 0x7effffffu;  // finite, positive, below the top binade
    const float f = bits_to_f32(bits);
    ASSERT_EQ(f32_to_bf16(f), bf16_reference(f)) << "bits=" << bits;
    ASSERT_EQ(f32_to_bf16(-f) & 0x7fff, bf16_reference(f) & 0x7fff);
  }
}

TEST(DType, Bf16TiesAndSpecials) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(3.4e38f), 0x7f80);  // overflows to inf
}

TEST(DType, F16RoundTripsEveryFiniteHalf) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const std::uint16_t hb = static_cast<std::uint16_t>(h);
    const float f = f16_to_f32(hb);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), hb) << "h=" << h;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  // Midpoints between consecutive halves round to the even one.
  for (std::uint32_t h = 0; h < 0x7bff; ++h) {
    const double a = f16_to_f32(static_cast<std::uint16_t>(h));
    const double b = f16_to_f32(static_cast<std::uint16_t>(h + 1));
    const float mid = static_cast<float>((a + b) / 2);  // exact in f32
    const std::uint16_t want =
        (h & 1) ? static_cast<std::uint16_t>(h + 1) : static_cast<std::uint16_t>(h);
    ASSERT_EQ(f32_to_f16(mid), want) << "h=" << h;
  }
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
}

TEST(DType, SafetensorsNames) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI8, DType::kU8,
                   DType::kI32, DType::kI64, DType::kBool}) {
    EXPECT_EQ(dtype_from_safetensors(to_safetensors(dt)), dt);
  }
  EXPECT_FALSE(dtype_from_safetensors("F8_E4M3").has_value());
}

}  // namespace
}  // namespace ferry
