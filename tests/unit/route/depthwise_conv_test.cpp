// SPDX-License-Identifier: Apache-2.0
// The depthwise 3x3 kernels (scalar and AVX2) against a naive double-precision loop over random
// shapes (odd and prime sizes, 1x1 planes, widths around the 8-float vector), both strides, with
// and without bias and clamp. Tolerance (style.md rule a): kernel error <= 2x the error of a naive
// float loop + 1e-6, both against the double loop. Seeds are printed on failure.
#include "route/depthwise_conv.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "conv_error_check.h"

namespace ferry::route {
namespace {

struct Case {
  int c, h, w, stride;
  bool bias, clamp;
};

// Naive zero-padded 3x3 depthwise convolution; Acc = double for the reference, float for the
// naive twin whose error sets the tolerance.
template <typename Acc>
std::vector<Acc> naive(const Case& k, const std::vector<float>& in, const std::vector<float>& w,
                       const std::vector<float>& b, float lo, float hi) {
  const int ho = (k.h - 1) / k.stride + 1, wo = (k.w - 1) / k.stride + 1;
  std::vector<Acc> out(static_cast<std::size_t>(k.c) * ho * wo);
  for (int c = 0; c < k.c; ++c) {
    for (int y = 0; y < ho; ++y) {
      for (int x = 0; x < wo; ++x) {
        Acc acc = k.bias ? b[c] : 0;
        for (int i = 0; i < 3; ++i) {
          for (int j = 0; j < 3; ++j) {
            const int iy = y * k.stride + i - 1, ix = x * k.stride + j - 1;
            if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;
            acc += static_cast<Acc>(w[c * 9 + i * 3 + j]) *
                   static_cast<Acc>(in[(static_cast<std::size_t>(c) * k.h + iy) * k.w + ix]);
          }
        }
        if (k.clamp) acc = std::min<Acc>(std::max<Acc>(acc, lo), hi);
        out[(static_cast<std::size_t>(c) * ho + y) * wo + x] = acc;
      }
    }
  }
  return out;
}

void check_case(const Case& k, unsigned seed, bool avx2) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> in(static_cast<std::size_t>(k.c) * k.h * k.w), w(k.c * 9), b(k.c);
  for (auto& v : in) v = nd(rng);
  for (auto& v : w) v = nd(rng);
  for (auto& v : b) v = nd(rng);
  const float lo = 0.0f, hi = 1.5f;  // a ReLU6-style clamp that cuts on both sides
  const int ho = depthwise_conv3x3_out_size(k.h, k.stride);
  const int wo = depthwise_conv3x3_out_size(k.w, k.stride);
  // One sentinel float after the output catches writes past the end.
  std::vector<float> out(static_cast<std::size_t>(k.c) * ho * wo + 1, 12345.0f);
  std::vector<float> scratch(depthwise_conv3x3_scratch_floats(k.h, k.w), 777.0f);
  DepthwiseConv3x3Args a;
  a.in = in.data();
  a.weight = w.data();
  a.bias = k.bias ? b.data() : nullptr;
  a.out = out.data();
  a.scratch = scratch.data();
  a.channels = k.c;
  a.height = k.h;
  a.width = k.w;
  a.stride = k.stride;
  if (k.clamp) {
    a.clamp_min = lo;
    a.clamp_max = hi;
  }
  if (avx2) {
    depthwise_conv3x3_avx2(a);
  } else {
    depthwise_conv3x3_scalar(a);
  }
  const auto want = naive<double>(k, in, w, b, lo, hi);
  const auto twin = naive<float>(k, in, w, b, lo, hi);
  std::ostringstream what;
  what << "seed=" << seed << " C=" << k.c << " H=" << k.h << " W=" << k.w << " stride=" << k.stride
       << " bias=" << k.bias << " clamp=" << k.clamp << (avx2 ? " avx2" : " scalar");
  testing::expect_within_twice_naive(out, want, twin, what.str());
}

std::vector<Case> cases() {
  std::vector<Case> v = {
      {1, 1, 1, 1, true, false},   {1, 1, 1, 2, false, false}, {3, 2, 2, 2, true, true},
      {2, 8, 8, 1, true, true},    {2, 8, 8, 2, true, true},   {5, 7, 9, 1, false, false},
      {4, 16, 17, 2, true, false}, {1, 3, 31, 1, true, true},  {3, 64, 64, 1, true, true},
      {2, 65, 63, 2, true, true},  {1, 1, 40, 2, true, false}, {1, 33, 1, 1, true, false},
  };
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<int> size(1, 41), ch(1, 6), st(1, 2), bit(0, 1);
  for (int i = 0; i < 24; ++i) {
    v.push_back({ch(rng), size(rng), size(rng), st(rng), bit(rng) == 1, bit(rng) == 1});
  }
  return v;
}

TEST(RouteDepthwiseConv, ScalarMatchesNaiveLoop) {
  unsigned seed = 1;
  for (const Case& k : cases()) check_case(k, seed++, /*avx2=*/false);
}

TEST(RouteDepthwiseConv, Avx2MatchesNaiveLoop) {
  if (!depthwise_conv3x3_have_avx2()) GTEST_SKIP() << "SKIPPED: cpu lacks avx2/fma";
  unsigned seed = 1;
  for (const Case& k : cases()) check_case(k, seed++, /*avx2=*/true);
}

TEST(RouteDepthwiseConv, OutputSizeIsPadOneFormula) {
  EXPECT_EQ(depthwise_conv3x3_out_size(128, 2), 64);
  EXPECT_EQ(depthwise_conv3x3_out_size(65, 2), 33);
  EXPECT_EQ(depthwise_conv3x3_out_size(1, 2), 1);
  EXPECT_EQ(depthwise_conv3x3_out_size(17, 1), 17);
}

}  // namespace
}  // namespace ferry::route
