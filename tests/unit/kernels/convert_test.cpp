// SPDX-License-Identifier: Apache-2.0
// Backend::convert (f32 <-> bf16, ops.h ConvertArgs) on the reference and CPU backends:
// hand-picked values whose bf16 rounding is known (ties to even, carries into the exponent,
// overflow to inf, NaN, signed zero, subnormals), bf16 -> f32 exactness, the CPU backend bit-equal
// to the reference on swept sizes (1, primes, one size that splits across threads), equal-dtype
// copies and the documented error codes. The CUDA backend is checked against the CPU one in
// tests/gpu/kernels_dense_test.cpp.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/backend.h"
#include "unit/kernels/kernel_test_util.h"

namespace ferry::kernels {
namespace {

using testing::HostTensor;
using testing::random_tensor;

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

HostTensor f32_of(const std::vector<float>& xs) {
  HostTensor t({static_cast<std::int64_t>(xs.size())}, DType::kF32);
  std::memcpy(t.data(), xs.data(), xs.size() * sizeof(float));
  return t;
}

std::vector<std::uint16_t> bits16(const HostTensor& t) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(t.numel()));
  std::memcpy(out.data(), t.data(), out.size() * 2);
  return out;
}

class Convert : public ::testing::TestWithParam<const char*> {
 protected:
  Backend& be() {
    return std::string(GetParam()) == "reference" ? reference_backend() : cpu_backend();
  }
};

TEST_P(Convert, F32ToBf16RoundsToNearestEven) {
  // value -> expected bf16 bits (upper 16 bits after round to nearest, ties to even).
  const std::vector<std::pair<float, std::uint16_t>> cases = {
      {1.0f, 0x3f80},
      {from_bits(0x3f808000u), 0x3f80},  // 1 + 2^-8: exactly halfway, even neighbour is 1.0
      {from_bits(0x3f818000u), 0x3f82},  // 1 + 3 * 2^-8: halfway, rounds up to the even 0x3f82
      {from_bits(0x3f808001u), 0x3f81},  // just above halfway: up
      {from_bits(0x3fff8000u), 0x4000},  // carry into the exponent (1.99609375 -> 2.0)
      {-2.5f, 0xc020},
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {from_bits(0x7f7fffffu), 0x7f80},  // FLT_MAX rounds to +inf
      {std::numeric_limits<float>::infinity(), 0x7f80},
      {-std::numeric_limits<float>::infinity(), 0xff80},
      {from_bits(0x00018000u), 0x0002},  // subnormal, halfway between 0x0001 and 0x0002: even
  };
  std::vector<float> in;
  for (const auto& c : cases) in.push_back(c.first);
  in.push_back(std::numeric_limits<float>::quiet_NaN());
  const HostTensor x = f32_of(in);
  HostTensor y({x.numel()}, DType::kBF16);
  FERRY_ASSERT_OK(be().convert({.out = y.view(), .in = x.cview()}, Stream::host()));
  const auto got = bits16(y);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(got[i], cases[i].second) << "case " << i << " value " << cases[i].first;
  }
  const std::uint16_t nan = got.back();
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0) << "NaN must stay NaN, got 0x" << std::hex << nan;
}

TEST_P(Convert, Bf16ToF32IsExactAndRoundTrips) {
  // Every finite bf16 pattern with a few exponents: bf16 -> f32 -> bf16 gives the same bits.
  std::vector<std::uint16_t> pats;
  for (std::uint32_t hi : {0x0000u, 0x0080u, 0x3f00u, 0x4700u, 0x7f00u, 0x8000u, 0xbf80u}) {
    for (std::uint32_t lo = 0; lo < 0x80; lo += 3)
      pats.push_back(static_cast<std::uint16_t>(hi | lo));
  }
  const std::int64_t n = static_cast<std::int64_t>(pats.size());
  HostTensor b({n}, DType::kBF16), f({n}, DType::kF32), back({n}, DType::kBF16);
  std::memcpy(b.data(), pats.data(), pats.size() * 2);
  FERRY_ASSERT_OK(be().convert({.out = f.view(), .in = b.cview()}, Stream::host()));
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t fb;
    std::memcpy(&fb, static_cast<const float*>(f.data()) + i, 4);
    EXPECT_EQ(fb, std::uint32_t{pats[static_cast<std::size_t>(i)]} << 16) << i;
  }
  FERRY_ASSERT_OK(be().convert({.out = back.view(), .in = f.cview()}, Stream::host()));
  EXPECT_EQ(bits16(back), pats);
}

TEST_P(Convert, SameDtypeCopiesAndReshapes) {
  const HostTensor x = random_tensor({3, 5}, DType::kF32, 7);
  HostTensor y({15}, DType::kF32);
  FERRY_ASSERT_OK(be().convert({.out = y.view(), .in = x.cview()}, Stream::host()));
  EXPECT_EQ(std::memcmp(x.data(), y.data(), 15 * sizeof(float)), 0);
}

TEST_P(Convert, BadArgumentsReturnStatus) {
  const HostTensor x = random_tensor({4}, DType::kF32, 1);
  HostTensor short_out({3}, DType::kBF16), ints({4}, DType::kI32);
  EXPECT_EQ(be().convert({.out = short_out.view(), .in = x.cview()}, Stream::host()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(be().convert({.out = ints.view(), .in = x.cview()}, Stream::host()).code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(be().convert({.out = {}, .in = x.cview()}, Stream::host()).code(),
            StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, Convert, ::testing::Values("reference", "cpu"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string(p.param);
                         });

TEST(ConvertCpuVsRef, BitEqualOnSweptSizes) {
  for (std::int64_t n : {1, 7, 31, 257, 100003}) {
    // Values spread over many binades so every rounding case occurs.
    HostTensor x = random_tensor({n}, DType::kF32, static_cast<std::uint64_t>(n), -1e3, 1e3);
    auto* p = static_cast<float*>(x.data());
    for (std::int64_t i = 0; i < n; i += 3) p[i] *= std::ldexp(1.0f, static_cast<int>(i % 60) - 30);
    HostTensor want({n}, DType::kBF16), got({n}, DType::kBF16);
    FERRY_ASSERT_OK(
        reference_backend().convert({.out = want.view(), .in = x.cview()}, Stream::host()));
    FERRY_ASSERT_OK(cpu_backend().convert({.out = got.view(), .in = x.cview()}, Stream::host()));
    EXPECT_EQ(bits16(got), bits16(want)) << "n=" << n;
    HostTensor back_ref({n}, DType::kF32), back_cpu({n}, DType::kF32);
    FERRY_ASSERT_OK(
        reference_backend().convert({.out = back_ref.view(), .in = want.cview()}, Stream::host()));
    FERRY_ASSERT_OK(
        cpu_backend().convert({.out = back_cpu.view(), .in = got.cview()}, Stream::host()));
    EXPECT_EQ(std::memcmp(back_ref.data(), back_cpu.data(), static_cast<std::size_t>(n) * 4), 0)
        << "n=" << n;
  }
  EXPECT_TRUE(cpu_backend().supports(OpKind::kConvert, DType::kBF16));
  EXPECT_TRUE(reference_backend().supports(OpKind::kConvert, DType::kBF16));
}

}  // namespace
}  // namespace ferry::kernels
