// SPDX-License-Identifier: Apache-2.0
// Sampling semantics against a reference written plainly here (sort everything, cut, normalise),
// reproducibility per seed, and the empirical frequencies of many draws.
#include <algorithm>
#include <cmath>
#include <map>

#include <gtest/gtest.h>

#include "serve/sampler.h"

namespace ferry::serve {
namespace {

// The reference: softmax(logits / T) in double, sort by (prob desc, id asc), keep top_k, keep the
// shortest prefix with mass >= top_p, renormalise.
std::vector<std::pair<std::int32_t, double>> reference(const std::vector<float>& logits, float T,
                                                       int top_k, float top_p) {
  std::vector<std::pair<std::int32_t, double>> v;
  double mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) z += std::exp((logits[i] - mx) / T);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    v.push_back({static_cast<std::int32_t>(i), std::exp((logits[i] - mx) / T) / z});
  }
  std::sort(v.begin(), v.end(), [](auto a, auto b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (top_k > 0 && static_cast<std::size_t>(top_k) < v.size()) v.resize(top_k);
  double mass = 0;
  std::size_t n = 0;
  for (; n < v.size();) {
    mass += v[n++].second;
    if (mass >= top_p) break;
  }
  v.resize(n);
  double kept = 0;
  for (auto& p : v) kept += p.second;
  for (auto& p : v) p.second /= kept;
  return v;
}

std::vector<float> random_logits(Rng& rng, int V) {
  std::vector<float> l(V);
  for (float& x : l) x = static_cast<float>(4.0 * rng.uniform() - 2.0);
  return l;
}

TEST(Sampler, DistributionMatchesPlainReference) {
  Rng rng(1);
  std::vector<std::pair<std::int32_t, double>> got;
  for (int trial = 0; trial < 200; ++trial) {
    const int V = 1 + static_cast<int>(rng.next() % 50);
    const auto logits = random_logits(rng, V);
    const float T = 0.2f + static_cast<float>(rng.uniform()) * 2.0f;
    const int k = static_cast<int>(rng.next() % 8);  // 0 = off
    const float p = rng.uniform() < 0.3 ? 1.0f : static_cast<float>(0.05 + 0.9 * rng.uniform());
    sampling_distribution(logits, {.temperature = T, .top_k = k, .top_p = p}, got);
    const auto want = reference(logits, T, k, p);
    ASSERT_EQ(got.size(), want.size()) << "V " << V << " k " << k << " p " << p;
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].first, want[i].first);
      EXPECT_NEAR(got[i].second, want[i].second, 1e-12);
    }
  }
}

TEST(Sampler, TopKAndTopPSemantics) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  std::vector<std::pair<std::int32_t, double>> d;
  sampling_distribution(logits, {.temperature = 1.0f, .top_k = 2}, d);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].first, 0);
  EXPECT_NEAR(d[0].second, 0.5 / 0.8, 1e-6);
  sampling_distribution(logits, {.temperature = 1.0f, .top_p = 0.75f}, d);
  ASSERT_EQ(d.size(), 2u);  // 0.5 < 0.75 <= 0.8
  sampling_distribution(logits, {.temperature = 1.0f, .top_p = 0.81f}, d);
  ASSERT_EQ(d.size(), 3u);
  sampling_distribution(logits, {.temperature = 1.0f, .top_p = 0.01f}, d);
  ASSERT_EQ(d.size(), 1u);  // always at least the most likely
  // Low temperature sharpens: at T = 0.1 almost all mass is on token 0.
  sampling_distribution(logits, {.temperature = 0.1f}, d);
  EXPECT_GT(d[0].second, 0.99);
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  Rng rng(3);
  std::vector<std::pair<std::int32_t, double>> scratch;
  EXPECT_EQ(sample(std::vector<float>{1, 3, 3, 2}, {}, rng, scratch), 1);
  EXPECT_EQ(argmax(std::vector<float>{-1, -1}), 0);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDiffers) {
  Rng data(11);
  const auto logits = random_logits(data, 40);
  const SamplingParams p{.temperature = 1.0f, .top_k = 30, .top_p = 0.95f};
  std::vector<std::pair<std::int32_t, double>> s;
  auto draw = [&](std::uint64_t seed) {
    Rng r(seed);
    std::vector<std::int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(sample(logits, p, r, s));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampler, EmpiricalFrequenciesFollowTheDistribution) {
  Rng data(5);
  const auto logits = random_logits(data, 12);
  const SamplingParams p{.temperature = 0.7f, .top_k = 6, .top_p = 0.9f};
  std::vector<std::pair<std::int32_t, double>> d, s;
  sampling_distribution(logits, p, d);
  std::map<std::int32_t, int> count;
  Rng r(123);
  const int N = 200000;
  for (int i = 0; i < N; ++i) ++count[sample(logits, p, r, s)];
  for (const auto& [id, prob] : d) {
    const double sd = std::sqrt(prob * (1 - prob) / N);
    EXPECT_NEAR(double(count[id]) / N, prob, 5 * sd + 1e-9) << "token " << id;
    count.erase(id);
  }
  EXPECT_TRUE(count.empty()) << "sampled a token outside the kept set";
}

TEST(Sampler, RejectsBadParameters) {
  EXPECT_FALSE(validate({.temperature = -1.0f}).ok());
  EXPECT_FALSE(validate({.top_k = -2}).ok());
  EXPECT_FALSE(validate({.top_p = 0.0f}).ok());
  EXPECT_FALSE(validate({.top_p = 1.5f}).ok());
  EXPECT_TRUE(validate({.temperature = 0.5f, .top_k = 3, .top_p = 0.5f}).ok());
}

}  // namespace
}  // namespace ferry::serve
