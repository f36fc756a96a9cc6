// SPDX-License-Identifier: Apache-2.0
// The 8-bit state codes (kernels/cpu/q8_code.h):
//   - the code grid is strictly increasing and every code round-trips;
//   - the arithmetic encoder equals a brute-force nearest-code search (ties to the even code);
//   - block-wise quantization of realistic m and sqrt(v) rows stays within the bounds derived
//     from the code's resolution (bitsandbytes-style: a mean-error bound and an outlier count):
//       per element  |x^ - x| <= max(2^-(M+1) |x|, sub * absmax / kMax)   (no outliers)
//       with sub = half the smallest step 2^-(15+M) for m, and the whole step 2^-(14+M) for
//       sqrt(v), whose positive values below half a step are lifted to the smallest code;
//       mean over the normal range  |x^ - x| / |x| <= 2^-M / 4
//     (rounding error uniform in +-spacing/2 gives E|err| = spacing/4, and spacing <= 2^-M |x|).
#include "kernels/cpu/q8_code.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "train/rng.h"

namespace ferry::kernels::cpu::q8 {
namespace {

template <int M>
void check_grid_and_nearest() {
  const int n_codes = kMaxCode<M> + 1;
  for (int c = 1; c < n_codes; ++c) {
    ASSERT_LT(decode_mag<M>(c - 1), decode_mag<M>(c)) << "code " << c;
  }
  for (int c = 0; c < n_codes; ++c) ASSERT_EQ(encode_mag<M>(decode_mag<M>(c)), c) << "code " << c;
  EXPECT_EQ(decode_mag<M>(kMaxCode<M>), kMax<M>);
  EXPECT_EQ(decode_mag<M>(1), kSubStep<M>);

  auto nearest = [&](float y) {
    int best = 0;
    double best_d = std::abs(double(decode_mag<M>(0)) - y);
    for (int c = 1; c < n_codes; ++c) {
      const double d = std::abs(double(decode_mag<M>(c)) - y);
      if (d < best_d || (d == best_d && c % 2 == 0)) {
        best = c;
        best_d = d;
      }
    }
    return best;
  };
  train::Rng rng(17 + M);
  std::vector<float> ys;
  for (int i = 0; i < 4000; ++i) {  // log-uniform over 2^-24 .. 2^1 (includes clamping above kMax)
    ys.push_back(static_cast<float>(std::ldexp(1.0 + rng.uniform(), -24 + int(rng.below(25)))));
  }
  for (int c = 0; c + 1 < n_codes; ++c) {  // exact midpoints: the tie rule
    const double mid = 0.5 * (double(decode_mag<M>(c)) + double(decode_mag<M>(c + 1)));
    if (static_cast<double>(static_cast<float>(mid)) == mid) ys.push_back(static_cast<float>(mid));
  }
  ys.push_back(0.0f);
  for (float y : ys) ASSERT_EQ(encode_mag<M>(y), nearest(y)) << "y=" << y;
}

TEST(Q8Code, MGridIsMonotoneAndEncodingIsNearest) { check_grid_and_nearest<kMBits>(); }
TEST(Q8Code, VGridIsMonotoneAndEncodingIsNearest) { check_grid_and_nearest<kVBits>(); }

TEST(Q8Code, SignAndNeverZeroRules) {
  const float inv = encode_multiplier<kMBits>(2.0f);
  const float deq = decode_multiplier<kMBits>(2.0f);
  EXPECT_EQ(decode_m(encode_m(-2.0f, inv), deq), -2.0f);
  EXPECT_EQ(decode_m(encode_m(2.0f, inv), deq), 2.0f);
  EXPECT_EQ(encode_m(1e-12f, inv), 0);  // below half the smallest step: 0
  const float inv_s = encode_multiplier<kVBits>(1.0f);
  EXPECT_EQ(encode_s(1e-30f, inv_s), 1);  // a positive sqrt(v) never becomes 0
  EXPECT_EQ(encode_s(0.0f, inv_s), 0);
  EXPECT_EQ(encode_m(1.0f, encode_multiplier<kMBits>(0.0f)), 0);  // all-zero block
  EXPECT_EQ(decode_m(0, decode_multiplier<kMBits>(0.0f)), 0.0f);
}

struct ErrStats {
  double mean_rel = 0.0;
  std::int64_t normal = 0;
  std::int64_t outliers = 0;
};

// Quantizes `x` block by block like the kernel (absmax of the block, then encode/decode).
template <int M>
ErrStats block_errors(const std::vector<float>& x) {
  ErrStats st;
  double sum_rel = 0.0;
  for (std::size_t b0 = 0; b0 < x.size(); b0 += kBlock) {
    const std::size_t b1 = std::min(x.size(), b0 + static_cast<std::size_t>(kBlock));
    float amax = 0.0f;
    for (std::size_t i = b0; i < b1; ++i) amax = std::max(amax, std::abs(x[i]));
    const float inv = encode_multiplier<M>(amax), deq = decode_multiplier<M>(amax);
    for (std::size_t i = b0; i < b1; ++i) {
      float got;
      if constexpr (M == kMBits) {
        got = decode_m(encode_m(x[i], inv), deq);
      } else {
        got = decode_s(encode_s(x[i], inv), deq);
      }
      const double err = std::abs(double(got) - double(x[i]));
      const double ax = std::abs(double(x[i]));
      // Normal-range bound, else the subnormal step bound; 2^-20 covers the f32 rounding of
      // the block multipliers (a few ulps).
      const int sub_exp = M == kMBits ? -(15 + M) : -(14 + M);
      const double bound =
          std::max(std::ldexp(ax, -(M + 1)), std::ldexp(double(amax), sub_exp) / double(kMax<M>)) *
          (1.0 + std::ldexp(1.0, -20));
      if (err > bound) ++st.outliers;
      if (ax * inv >= kMinNormal) {
        sum_rel += err / ax;
        ++st.normal;
      }
    }
  }
  st.mean_rel = sum_rel / static_cast<double>(std::max<std::int64_t>(1, st.normal));
  return st;
}

TEST(Q8Code, BlockErrorsWithinTheCodesResolution) {
  train::Rng rng(99);
  // m-like rows: Gaussian with a few 30x outliers per block (they set the absmax).
  std::vector<float> m(20 * kBlock + 777);
  for (auto& x : m) {
    x = static_cast<float>(rng.normal() * 1e-3 * (rng.uniform() < 0.002 ? 30.0 : 1.0));
  }
  // sqrt(v)-like rows: log-normal over ~6 decades.
  std::vector<float> s(20 * kBlock + 777);
  for (auto& x : s) x = static_cast<float>(1e-4 * std::exp(3.0 * rng.normal()));

  const ErrStats em = block_errors<kMBits>(m);
  EXPECT_EQ(em.outliers, 0);
  EXPECT_GT(em.normal, static_cast<std::int64_t>(m.size() * 0.99));
  EXPECT_LE(em.mean_rel, std::ldexp(1.0, -kMBits) / 4) << "m mean relative error";
  const ErrStats es = block_errors<kVBits>(s);
  EXPECT_EQ(es.outliers, 0);
  EXPECT_LE(es.mean_rel, std::ldexp(1.0, -kVBits) / 4) << "sqrt(v) mean relative error";
  std::printf("q8: m mean rel err %.4f (bound %.4f), sqrt(v) %.4f (bound %.4f)\n", em.mean_rel,
              std::ldexp(1.0, -kMBits) / 4, es.mean_rel, std::ldexp(1.0, -kVBits) / 4);
}

}  // namespace
}  // namespace ferry::kernels::cpu::q8
