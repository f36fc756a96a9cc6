// SPDX-License-Identifier: Apache-2.0
// The MV-WSA allocator (serve/wsa/split_allocator.h) on random curves:
//   - every allocation is feasible: bytes <= budget, min_slots <= caps <= E, KV >= floor;
//   - its modelled step time is <= that of every fixed (uniform-cap) split on the same curves,
//     which this test enumerates and prices itself (so it is also <= the oracle's minimum);
//   - on convex curves with equal quanta the marginal-value greedy alone equals the brute-force
//     optimum over all per-layer cap vectors (the exactness claim of the convexified problem);
//   - the lower convex hull lies under the curve, touches it at its vertices and is convex.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "serve/wsa/convex_curve.h"
#include "serve/wsa/split_allocator.h"
#include "unit/serve/wsa_random_problem.h"

namespace ferry::serve::wsa {
namespace {

// Random non-increasing curve of n+1 points; convex = true makes the decrements non-increasing.
std::vector<double> random_curve(std::mt19937& rng, int n, bool convex) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<double> steps(static_cast<std::size_t>(n));
  for (double& s : steps) s = u(rng) * u(rng) * 10;
  if (convex) std::sort(steps.rbegin(), steps.rend());
  std::vector<double> y(std::size_t(n) + 1);
  double total = 0;
  for (double s : steps) total += s;
  y[0] = total + u(rng);
  for (int i = 0; i < n; ++i) y[std::size_t(i) + 1] = y[std::size_t(i)] - steps[std::size_t(i)];
  return y;
}

SplitProblem random_problem(std::mt19937& rng, int L, int E, int kv_max, bool convex,
                            bool equal_quanta) {
  return testing::random_problem(rng, L, E, kv_max, convex, equal_quanta, random_curve);
}

double price(const SplitProblem& p, const std::vector<int>& caps, int kv) {
  double t = p.kv_block_cost_s * p.kv_short[std::size_t(std::min(kv, p.kv_max_blocks()))];
  for (std::size_t l = 0; l < caps.size(); ++l) {
    t += p.miss_cost_s * p.expert_misses[l][std::size_t(caps[l])];
  }
  return t;
}

void expect_feasible(const SplitProblem& p, const Split& s) {
  std::size_t bytes = std::size_t(s.kv_blocks) * p.kv_block_bytes;
  for (int c : s.slots) {
    EXPECT_GE(c, p.min_slots);
    EXPECT_LE(c, p.experts());
    bytes += std::size_t(c) * p.expert_bytes;
  }
  EXPECT_LE(bytes, p.budget_bytes);
  EXPECT_GE(s.kv_blocks, p.kv_floor_blocks);
}

TEST(WsaAllocator, FeasibleAndNoWorseThanEveryFixedSplit) {
  std::mt19937 rng(2026);
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int L = 1 + static_cast<int>(rng() % 6), E = 2 + static_cast<int>(rng() % 30);
    const SplitProblem p =
        random_problem(rng, L, E, 5 + static_cast<int>(rng() % 80), trial % 3 == 0, false);
    auto s = allocate(p);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    expect_feasible(p, *s);
    const double t = price(p, s->slots, s->kv_blocks);
    EXPECT_DOUBLE_EQ(t, modelled_step_s(p, *s));
    // Every fixed split: the same cap in every layer, the rest (whole blocks) to KV.
    for (int c = p.min_slots; c <= E; ++c) {
      const std::size_t eb = std::size_t(L * c) * p.expert_bytes;
      if (eb > p.budget_bytes) break;
      const int kv = static_cast<int>(
          std::min<std::size_t>((p.budget_bytes - eb) / p.kv_block_bytes, p.kv_max_blocks()));
      if (kv < p.kv_floor_blocks) continue;
      EXPECT_LE(t, price(p, std::vector<int>(std::size_t(L), c), kv) * (1 + 1e-12))
          << "trial " << trial << " cap " << c;
      ++compared;
    }
    // Polishing never makes the greedy worse.
    auto g = greedy_on_hulls(p);
    ASSERT_TRUE(g.ok());
    expect_feasible(p, *g);
    EXPECT_LE(t, modelled_step_s(p, *g) * (1 + 1e-12));
  }
  EXPECT_GT(compared, 1000);
}

// Brute force over every cap vector; KV takes every remaining whole block (curves never rise).
double brute_force_optimum(const SplitProblem& p) {
  const int L = static_cast<int>(p.expert_misses.size());
  std::vector<int> caps(std::size_t(L), p.min_slots);
  double best = 1e300;
  std::function<void(int, std::size_t)> rec = [&](int l, std::size_t used) {
    if (l == L) {
      if (used > p.budget_bytes) return;
      const int kv = static_cast<int>(
          std::min<std::size_t>((p.budget_bytes - used) / p.kv_block_bytes, p.kv_max_blocks()));
      if (kv >= p.kv_floor_blocks) best = std::min(best, price(p, caps, kv));
      return;
    }
    for (int c = p.min_slots; c <= p.experts(); ++c) {
      caps[std::size_t(l)] = c;
      rec(l + 1, used + std::size_t(c) * p.expert_bytes);
    }
  };
  rec(0, 0);
  return best;
}

TEST(WsaAllocator, GreedyOnConvexCurvesWithEqualQuantaIsOptimal) {
  std::mt19937 rng(77);
  for (int trial = 0; trial < 200; ++trial) {
    const int L = 1 + static_cast<int>(rng() % 3), E = 2 + static_cast<int>(rng() % 7);
    const SplitProblem p = random_problem(rng, L, E, 3 + static_cast<int>(rng() % 12), true, true);
    auto g = greedy_on_hulls(p);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    expect_feasible(p, *g);
    const double opt = brute_force_optimum(p);
    EXPECT_NEAR(modelled_step_s(p, *g), opt, 1e-12 * (1 + opt)) << "trial " << trial;
    auto a = allocate(p);
    ASSERT_TRUE(a.ok());
    EXPECT_NEAR(modelled_step_s(p, *a), opt, 1e-12 * (1 + opt)) << "trial " << trial;
  }
}

TEST(WsaAllocator, RefusesABudgetBelowTheMinimumSplit) {
  std::mt19937 rng(5);
  SplitProblem p = random_problem(rng, 3, 8, 20, false, false);
  p.kv_floor_blocks = 10;
  p.budget_bytes = 3 * std::size_t(p.min_slots) * p.expert_bytes + 9 * p.kv_block_bytes;
  auto s = allocate(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted) << s.status().to_string();
}

TEST(WsaConvexCurve, HullIsBelowTouchesAtVerticesAndConvex) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 100; ++trial) {
    const std::vector<double> y = random_curve(rng, 1 + static_cast<int>(rng() % 50), false);
    const std::vector<double> h = convexify(y);
    for (std::size_t x = 0; x < y.size(); ++x) EXPECT_LE(h[x], y[x] + 1e-12);
    for (int v : lower_convex_hull(y)) EXPECT_DOUBLE_EQ(h[std::size_t(v)], y[std::size_t(v)]);
    for (std::size_t x = 1; x + 1 < h.size(); ++x) {
      EXPECT_LE(h[x] - h[x + 1], h[x - 1] - h[x] + 1e-9) << "not convex at " << x;
    }
  }
}

TEST(WsaConvexCurve, KvShortageIsTheMeanHinge) {
  const std::vector<double> d = {3, 5, 0, 8};
  const std::vector<double> s = kv_shortage_curve(d, 10);
  ASSERT_EQ(s.size(), 11u);
  for (int k = 0; k <= 10; ++k) {
    double want = 0;
    for (double x : d) want += std::max(0.0, x - k);
    EXPECT_DOUBLE_EQ(s[std::size_t(k)], want / 4) << k;
  }
}

}  // namespace
}  // namespace ferry::serve::wsa
