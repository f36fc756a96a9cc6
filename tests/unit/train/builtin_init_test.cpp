// SPDX-License-Identifier: Apache-2.0
// The chunked parallel init of large built-in models (builtin_model.h): every chunk is the first
// values of its own seeded stream (checked against a plain sequential loop over the chunks), the
// bits do not depend on the thread count, different tensors get different streams, and the
// values are N(0, std^2) to sampling accuracy.
#include <gtest/gtest.h>

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
    for (std::int64_t k = c * kInitChunk; k < std::min(n, (c + 1) * kInitChunk); ++k)
      want[static_cast<std::size_t>(k)] = static_cast<float>(rng.normal() * std);
  }
  std::vector<float> got(want.size(), -1.0f);
  fill_normal_chunked(got.data(), n, std, seed);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  // Another seed is another tensor's stream.
  std::vector<float> other(want.size());
  fill_normal_chunked(other.data(), n, std, seed + 1);
  EXPECT_NE(std::memcmp(other.data(), want.data(), want.size() * sizeof(float)), 0);
  // Moments: mean ~ 0, std ~ 0.02 over ~2.1 M samples (standard errors ~1.4e-5 and ~1e-5).
  double s = 0, s2 = 0;
  for (float x : got) {
    s += x;
    s2 += double(x) * x;
  }
  const double mean = s / double(n), sd = std::sqrt(s2 / double(n) - mean * mean);
  EXPECT_LT(std::fabs(mean), 1e-4);
  EXPECT_LT(std::fabs(sd - std), 1e-4);
}

}  // namespace
}  // namespace ferry::train
