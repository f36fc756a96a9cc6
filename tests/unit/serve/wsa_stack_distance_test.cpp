// SPDX-License-Identifier: Apache-2.0
// Mattson stack distances (serve/wsa/stack_distance.h) against a brute-force LRU simulated at
// every capacity, on random traces (uniform, Zipf-like and the calibrated synthetic decode
// trace), including traces long enough to force several timestamp renumberings; and step sets
// (access_set, the pager's set acquire) against a brute-force set LRU at every capacity.
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

// The pager's set acquire at capacity `cap` (ExpertPager::acquire of one step's distinct
// experts): a hit iff resident at the step's start; then the set is touched most recently used
// first (never used last, by id), each miss evicting the least recently used. Brute force: a list,
// most recent first, and every item's last use ever (to order the set).
std::uint64_t brute_force_set_lru_misses(const std::vector<std::vector<int>>& steps, int items,
                                         int cap) {
  std::list<int> lru;
  std::vector<long> last(std::size_t(items), -1);
  long tick = 0;
  std::uint64_t misses = 0;
  for (const std::vector<int>& set : steps) {
    for (int x : set) misses += std::find(lru.begin(), lru.end(), x) == lru.end();
    std::vector<int> order = set;
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      if ((last[std::size_t(a)] < 0) != (last[std::size_t(b)] < 0)) return last[std::size_t(b)] < 0;
      return last[std::size_t(a)] != last[std::size_t(b)]
                 ? last[std::size_t(a)] > last[std::size_t(b)]
                 : a < b;
    });
    for (int x : order) {
      auto it = std::find(lru.begin(), lru.end(), x);
      if (it != lru.end()) {
        lru.erase(it);
      } else if (cap > 0 && static_cast<int>(lru.size()) == cap) {
        lru.pop_back();
      }
      if (cap > 0) lru.push_front(x);
      last[std::size_t(x)] = tick++;
    }
  }
  return misses;
}

TEST(WsaStackDistance, StepSetsEqualBruteForceSetLruAtEveryCapacity) {
  std::mt19937 rng(777);
  std::vector<std::pair<int, int>> scratch;
  for (int trial = 0; trial < 24; ++trial) {
    const int items = 2 + static_cast<int>(rng() % 40);
    const int n_steps = 1 + static_cast<int>(rng() % 200);
    // Steps of 1..items distinct items (some "prefill" steps touch most of them), skewed or not.
    std::vector<std::vector<int>> steps(static_cast<std::size_t>(n_steps));
    for (std::vector<int>& set : steps) {
      const int want = trial % 4 == 0 ? items : 1 + static_cast<int>(rng() % items);
      std::vector<std::uint8_t> in(std::size_t(items), 0);
      for (int tries = 0; tries < 4 * want && static_cast<int>(set.size()) < want; ++tries) {
        const double u = std::uniform_real_distribution<double>(0, 1)(rng);
        const int x = std::min(items - 1, static_cast<int>((trial % 2 ? u * u : u) * items));
        if (!in[std::size_t(x)]) in[std::size_t(x)] = 1, set.push_back(x);
      }
    }
    StackDistance sd(items, trial % 3 == 0 ? 2 * items + 2 : 1 << 16);
    double accesses = 0;
    for (const std::vector<int>& set : steps) {
      sd.access_set(set, scratch);
      accesses += double(set.size());
    }
    EXPECT_EQ(sd.accesses(), accesses);
    const std::vector<double> curve = sd.miss_curve();
    for (int c = 0; c <= items; ++c) {
      EXPECT_EQ(curve[std::size_t(c)], double(brute_force_set_lru_misses(steps, items, c)))
          << "capacity " << c << " items " << items << " trial " << trial;
    }
  }
}

TEST(WsaStackDistance, AFullSetHitsEveryResidentNotLikeAccessOrderLru) {
  // Two steps touching all 8 items in the same order: access-order LRU (access()) misses all 16
  // at every capacity below 8 (its cyclic worst case); the set model hits the c residents of the
  // second step at capacity c, as the pager does.
  StackDistance by_access(8), by_set(8);
  std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<std::pair<int, int>> scratch;
  for (int step = 0; step < 2; ++step) {
    for (int x : all) by_access.access(x);
    by_set.access_set(all, scratch);
  }
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(by_access.misses_at(c), 16.0) << c;
    EXPECT_EQ(by_set.misses_at(c), 16.0 - c) << c;
  }
  EXPECT_EQ(by_set.misses_at(8), 8.0);
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
