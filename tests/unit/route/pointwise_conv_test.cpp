// SPDX-License-Identifier: Apache-2.0
// The pointwise 1x1 kernels (scalar, AVX2, AVX-512) against a naive double-precision loop over
// swept shapes: 1 channel / 1 pixel, primes, pixel counts around the vector and tile widths (8, 24,
// 16, 64), C_out not a multiple of the 4-row tile, and the skip estimator's own shapes; with and
// without bias and clamp. Tolerance (style.md rule a): kernel error <= 2x the error of a naive
// float loop (same sum order, no FMA) + 1e-6, both against the double loop. A sentinel after the
// output catches writes past the end. Seeds are printed on failure.
#include "route/pointwise_conv.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "conv_error_check.h"

namespace ferry::route {
namespace {

enum class Isa { kScalar, kAvx2, kAvx512 };

struct Case {
  int c_out, c_in, pixels;
  bool bias, clamp;
};

// out[co][p] = clamp(b[co] + sum_ci w[co][ci] in[ci][p]) with Acc = double (the reference) or float
// (the naive twin whose error sets the tolerance). w is [C_out, C_in] as OpenCV stores it.
template <typename Acc>
std::vector<Acc> naive(const Case& k, const std::vector<float>& in, const std::vector<float>& w,
                       const std::vector<float>& b, float lo, float hi) {
  std::vector<Acc> out(static_cast<std::size_t>(k.c_out) * k.pixels);
  for (int co = 0; co < k.c_out; ++co) {
    for (int p = 0; p < k.pixels; ++p) {
      Acc acc = k.bias ? b[co] : 0;
      for (int ci = 0; ci < k.c_in; ++ci) {
        acc += static_cast<Acc>(w[static_cast<std::size_t>(co) * k.c_in + ci]) *
               static_cast<Acc>(in[static_cast<std::size_t>(ci) * k.pixels + p]);
      }
      if (k.clamp) acc = std::min<Acc>(std::max<Acc>(acc, lo), hi);
      out[static_cast<std::size_t>(co) * k.pixels + p] = acc;
    }
  }
  return out;
}

void check_case(const Case& k, unsigned seed, Isa isa) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> in(static_cast<std::size_t>(k.c_in) * k.pixels);
  std::vector<float> w(static_cast<std::size_t>(k.c_out) * k.c_in), b(k.c_out);
  for (auto& v : in) v = nd(rng);
  for (auto& v : w) v = nd(rng);
  for (auto& v : b) v = nd(rng);
  std::vector<float> wt(w.size(), 555.0f);
  pointwise_conv_transpose_weights(w.data(), k.c_out, k.c_in, wt.data());
  const float lo = -0.5f, hi = 1.5f;  // a clamp that cuts on both sides of N(0, C_in) sums
  std::vector<float> out(static_cast<std::size_t>(k.c_out) * k.pixels + 1, 12345.0f);
  PointwiseConvArgs a;
  a.in = in.data();
  a.weight_t = wt.data();
  a.bias = k.bias ? b.data() : nullptr;
  a.out = out.data();
  a.in_channels = k.c_in;
  a.out_channels = k.c_out;
  a.pixels = k.pixels;
  if (k.clamp) {
    a.clamp_min = lo;
    a.clamp_max = hi;
  }
  switch (isa) {
    case Isa::kScalar:
      pointwise_conv_scalar(a);
      break;
    case Isa::kAvx2:
      pointwise_conv_avx2(a);
      break;
    case Isa::kAvx512:
      pointwise_conv_avx512(a);
      break;
  }
  const auto want = naive<double>(k, in, w, b, lo, hi);
  const auto twin = naive<float>(k, in, w, b, lo, hi);
  std::ostringstream what;
  what << "seed=" << seed << " C_out=" << k.c_out << " C_in=" << k.c_in << " P=" << k.pixels
       << " bias=" << k.bias << " clamp=" << k.clamp << " isa=" << static_cast<int>(isa);
  testing::expect_within_twice_naive(out, want, twin, what.str());
}

std::vector<Case> cases() {
  std::vector<Case> v = {
      {1, 1, 1, true, false},       {1, 1, 1, false, true},      {3, 2, 7, true, true},
      {4, 3, 8, true, true},        {5, 7, 9, false, false},     {4, 16, 16, true, false},
      {7, 5, 23, true, true},       {8, 8, 24, true, true},      {9, 11, 25, false, true},
      {6, 13, 63, true, true},      {4, 4, 64, true, false},     {13, 17, 65, true, true},
      {2, 3, 100, true, true},      {16, 32, 4096, true, false}, {96, 16, 4096, true, true},
      {24, 144, 1024, true, false}, {576, 96, 64, true, true},   {96, 576, 64, true, false},
      {3, 1, 97, true, true},       {1, 29, 33, false, false},
  };
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<int> ch(1, 40), px(1, 150), bit(0, 1);
  for (int i = 0; i < 24; ++i) {
    v.push_back({ch(rng), ch(rng), px(rng), bit(rng) == 1, bit(rng) == 1});
  }
  return v;
}

TEST(RoutePointwiseConv, ScalarMatchesNaiveLoop) {
  unsigned seed = 1;
  for (const Case& k : cases()) check_case(k, seed++, Isa::kScalar);
}

TEST(RoutePointwiseConv, Avx2MatchesNaiveLoop) {
  if (!pointwise_conv_have_avx2()) GTEST_SKIP() << "SKIPPED: cpu lacks avx2/fma";
  unsigned seed = 1;
  for (const Case& k : cases()) check_case(k, seed++, Isa::kAvx2);
}

TEST(RoutePointwiseConv, Avx512MatchesNaiveLoop) {
  if (!pointwise_conv_have_avx512()) GTEST_SKIP() << "SKIPPED: cpu lacks avx512f";
  unsigned seed = 1;
  for (const Case& k : cases()) check_case(k, seed++, Isa::kAvx512);
}

TEST(RoutePointwiseConv, TransposeIsCinByCout) {
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};  // [C_out = 2, C_in = 3]
  std::vector<float> wt(6);
  pointwise_conv_transpose_weights(w.data(), 2, 3, wt.data());
  EXPECT_EQ(wt, (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

}  // namespace
}  // namespace ferry::route
