// SPDX-License-Identifier: Apache-2.0
// Mattson stack distances (serve/wsa/stack_distance.h) against a brute-force LRU simulated at
// every capacity, on random traces (uniform, Zipf-like and the calibrated synthetic decode
// trace), including traces long enough to force several timestamp renumberings.
#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <random>

#include "serve/trace_synth.h"
#include "serve/wsa/stack_distance.h"

namespace ferry::serve::wsa {
namespace {

// Plain LRU of `cap` slots: a list, most recent first.
std::uint64_t brute_force_lru_misses(const std::vector<int>& trace, int cap) {
  std::list<int> lru;
  std::uint64_t misses = 0;
  for (int x : trace) {
    auto it = std::find(lru.begin(), lru.end(), x);
    if (it != lru.end()) {
      lru.erase(it);
    } else {
      ++misses;
      if (cap > 0 && static_cast<int>(lru.size()) == cap) lru.pop_back();
    }
    if (cap > 0) lru.push_front(x);
  }
  return misses;
}

void expect_curve_matches(const std::vector<int>& trace, int items, int window) {
  StackDistance sd(items, window);
  for (int x : trace) sd.access(x);
  const std::vector<double> curve = sd.miss_curve();
  ASSERT_EQ(static_cast<int>(curve.size()), items + 1);
  EXPECT_EQ(sd.accesses(), double(trace.size()));
  for (int c = 0; c <= items; ++c) {
    EXPECT_EQ(curve[std::size_t(c)], double(brute_force_lru_misses(trace, c)))
        << "capacity " << c << " items " << items << " window " << window;
    EXPECT_EQ(sd.misses_at(c), curve[std::size_t(c)]);
  }
}

TEST(WsaStackDistance, EqualsBruteForceLruAtEveryCapacityOnRandomTraces) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 30; ++trial) {
    const int items = 1 + static_cast<int>(rng() % 40);
    const int n = 1 + static_cast<int>(rng() % 3000);
    const bool skewed = trial % 2 == 1;
    std::vector<int> trace(static_cast<std::size_t>(n));
    for (int& x : trace) {
      // Skewed: the square of a uniform draw favours low ids (a Zipf-like popularity).
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      x = std::min(items - 1, static_cast<int>((skewed ? u * u : u) * items));
    }
    // A small window forces many renumberings; the default one none.
    expect_curve_matches(trace, items, trial % 3 == 0 ? 2 * items + 2 : 1 << 16);
  }
}

TEST(WsaStackDistance, EqualsBruteForceLruOnCalibratedDecodeTrace) {
  const RoutingTrace t = make_synthetic_trace(
      {.experts = 64, .top_k = 4, .prefill_tokens = 16, .decode_tokens = 600, .seed = 9});
  std::vector<int> trace;
  for (const auto& [key, ids] : t.routes) trace.insert(trace.end(), ids.begin(), ids.end());
  expect_curve_matches(trace, 64, 300);
}

TEST(WsaStackDistance, DepthOfSimplePattern) {
  StackDistance sd(4);
  EXPECT_EQ(sd.access(0), 0);  // cold
  EXPECT_EQ(sd.access(1), 0);
  EXPECT_EQ(sd.access(0), 2);  // one other item since
  EXPECT_EQ(sd.access(0), 1);
  EXPECT_EQ(sd.access(2), 0);
  EXPECT_EQ(sd.access(1), 3);
  EXPECT_EQ(sd.cold(), 3.0);
  sd.scale(0.5);
  EXPECT_EQ(sd.accesses(), 3.0);
  EXPECT_EQ(sd.misses_at(4), 1.5);
}

}  // namespace
}  // namespace ferry::serve::wsa
