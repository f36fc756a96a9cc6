// SPDX-License-Identifier: Apache-2.0
// Sampling semantics against a reference written plainly here (sort everything, cut, normalise),
// reproducibility per seed, and the empirical frequencies of many draws.
#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "serve/sampler.h"

namespace ferry::serve {
namespace {

// The reference, written from the header's rule: w = exp((logit - max) / T) in double, rank by (w
// desc, id asc), keep top_k, keep w >= min_p, keep the shortest prefix with mass >= top_p,
// renormalise over the kept set in id order.
std::vector<std::pair<std::int32_t, double>> reference(const std::vector<float>& logits, float T,
                                                       int top_k, float top_p, float min_p = 0) {
  std::vector<std::pair<std::int32_t, double>> v;
  double mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) z += std::exp((logits[i] - mx) / T);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    v.push_back({static_cast<std::int32_t>(i), std::exp((logits[i] - mx) / T)});
  }
  std::sort(v.begin(), v.end(), [](auto a, auto b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (top_k > 0 && static_cast<std::size_t>(top_k) < v.size()) v.resize(top_k);
  while (v.size() > 1 && v.back().second < min_p) v.pop_back();
  double mass = 0;
  std::size_t n = 0;
  for (; n < v.size();) {
    mass += v[n++].second / z;
    if (mass >= top_p) break;
  }
  v.resize(n);
  std::sort(v.begin(), v.end());
  double kept = 0;
  for (auto& p : v) kept += p.second / z;
  for (auto& p : v) p.second = p.second / z / kept;
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
    const float mp = rng.uniform() < 0.5 ? 0.0f : static_cast<float>(0.5 * rng.uniform());
    sampling_distribution(logits, {.temperature = T, .top_k = k, .top_p = p, .min_p = mp}, got);
    const auto want = reference(logits, T, k, p, mp);
    ASSERT_EQ(got.size(), want.size()) << "V " << V << " k " << k << " p " << p << " min_p " << mp;
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
  // min_p 0.5: tokens with at least half of the most likely one's probability (0.5 and 0.3 >=
  // 0.25).
  sampling_distribution(logits, {.temperature = 1.0f, .min_p = 0.5f}, d);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NEAR(d[1].second, 0.3 / 0.8, 1e-6);
  sampling_distribution(logits, {.temperature = 1.0f, .min_p = 1.0f}, d);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].first, 0);
  // Low temperature sharpens: at T = 0.1 almost all mass is on token 0.
  sampling_distribution(logits, {.temperature = 0.1f}, d);
  EXPECT_GT(d[0].second, 0.99);
}

// The fast path ranks only a prefix of the row (a heap or a selection, grown geometrically for
// top_p); its slow twin sorts the whole row. Same list, bit for bit, on vocabulary-sized rows with
// ties, -inf logits, flat and peaked shapes, and every cut alone and together.
TEST(Sampler, FastPathEqualsSortedTwinBitForBit) {
  Rng rng(21);
  std::vector<std::pair<std::int32_t, double>> fast, slow;
  int compared = 0, grown = 0;
  for (const int V : {1, 2, 63, 64, 65, 257, 5000, 151936}) {
    for (int shape = 0; shape < 5; ++shape) {
      std::vector<float> logits(static_cast<std::size_t>(V));
      for (float& x : logits) {
        const double u = rng.uniform();
        switch (shape) {
          case 0:
            x = static_cast<float>(4.0 * u - 2.0);
            break;  // flat-ish
          case 1:
            x = static_cast<float>(12.0 * u * u * u * u - 3.0);
            break;  // peaked, long tail
          case 2:
            x = static_cast<float>(std::floor(u * 4.0));
            break;  // four tie classes
          case 3:
            x = 1.0f;
            break;  // all tied
          default:
            x = u < 0.3 ? -INFINITY : static_cast<float>(8.0 * u);
            break;  // masked ids
        }
      }
      if (shape == 4) logits[0] = 8.0f;  // at least one finite logit
      for (const float T : {0.3f, 1.0f}) {
        for (const int k : {0, 1, 40, 64, 65, V - 1, V, V + 5}) {
          for (const float p : {1.0f, 0.999999f, 0.95f, 0.5f, 1e-6f}) {
            for (const float mp : {0.0f, 0.02f, 0.5f}) {
              // The vocabulary-sized row (one full sort each): a few of each cut, to keep it short.
              if (V > 5000 &&
                  (T != 1.0f || (k != 0 && k != 40) || (p != 1.0f && p != 0.95f) || mp == 0.5f)) {
                continue;
              }
              const SamplingParams sp{.temperature = T, .top_k = k, .top_p = p, .min_p = mp};
              sampling_distribution_sorted(logits, sp, slow);
              // The fast path's own start (the bucketed nucleus bound), and first prefixes of 1
              // and 64 tokens, which the walk must grow x4 until it reaches top_p.
              for (const std::size_t first : {std::size_t{0}, std::size_t{1}, std::size_t{64}}) {
                if (first == 0) {
                  sampling_distribution(logits, sp, fast);
                } else {
                  sampling_distribution_from(logits, sp, first, fast);
                }
                ASSERT_EQ(fast.size(), slow.size())
                    << "V " << V << " shape " << shape << " T " << T << " k " << k << " p " << p
                    << " min_p " << mp << " first " << first;
                for (std::size_t i = 0; i < slow.size(); ++i) {
                  ASSERT_EQ(fast[i].first, slow[i].first)
                      << "V " << V << " shape " << shape << " T " << T << " k " << k << " p " << p
                      << " min_p " << mp << " first " << first << " entry " << i;
                  ASSERT_EQ(std::bit_cast<std::uint64_t>(fast[i].second),
                            std::bit_cast<std::uint64_t>(slow[i].second))
                      << "V " << V << " entry " << i << " first " << first;
                }
                ++compared;
                if (first > 0 && p < 1.0f && slow.size() > 4 * first &&
                    slow.size() < std::size_t(V))
                  ++grown;
              }
            }
          }
        }
      }
    }
  }
  // The top_p walk had to rank past its first prefix more than once in many of them (the growth
  // path ran, several rounds).
  EXPECT_GT(grown, 20) << compared << " compared";
}

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  Rng rng(3);
  std::vector<std::pair<std::int32_t, double>> scratch;
  EXPECT_EQ(sample(std::vector<float>{1, 3, 3, 2}, {}, rng, scratch), 1);
  EXPECT_EQ(argmax(std::vector<float>{-1, -1}), 0);
  EXPECT_EQ(argmax(std::vector<float>{-INFINITY, -INFINITY, -5}), 2);
  // A scan against a plain one on rows with many ties (the max and its first index found apart).
  Rng r(9);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> row(1 + r.next() % 3000);
    for (float& x : row) x = static_cast<float>(r.next() % 7);
    std::int32_t want = 0;
    for (std::size_t i = 1; i < row.size(); ++i) {
      if (row[i] > row[std::size_t(want)]) want = static_cast<std::int32_t>(i);
    }
    ASSERT_EQ(argmax(row), want) << "trial " << trial;
  }
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
  EXPECT_FALSE(validate({.min_p = -0.1f}).ok());
  EXPECT_FALSE(validate({.min_p = 1.5f}).ok());
  EXPECT_TRUE(validate({.temperature = 0.5f, .top_k = 3, .top_p = 0.5f}).ok());
}

}  // namespace
}  // namespace ferry::serve
