// SPDX-License-Identifier: Apache-2.0
// Random MV-WSA split problems for the allocator tests (wsa_allocator_test.cpp,
// wsa_allocator_balance_test.cpp): L layers of E experts and a KV curve of kv_max blocks, each
// curve drawn by the caller's `curve(rng, n, convex)` (non-increasing, n + 1 points), a random
// KV floor and block size, and a budget anywhere between the minimum split and everything.
#pragma once

#include <cstddef>
#include <functional>
#include <random>
#include <vector>

#include "serve/wsa/split_allocator.h"

namespace ferry::serve::wsa::testing {

using CurveFn = std::function<std::vector<double>(std::mt19937&, int, bool)>;

inline SplitProblem random_problem(std::mt19937& rng, int L, int E, int kv_max, bool convex,
                                   bool equal_quanta, const CurveFn& curve) {
  SplitProblem p;
  p.expert_bytes = 1000;
  p.kv_block_bytes = equal_quanta ? 1000 : 1 + rng() % 700;
  p.min_slots = 1 + static_cast<int>(rng() % 2);
  for (int l = 0; l < L; ++l) p.expert_misses.push_back(curve(rng, E, convex));
  p.kv_short = curve(rng, kv_max, convex);
  p.kv_floor_blocks = static_cast<int>(rng() % (kv_max / 2 + 1));
  p.miss_cost_s = 1e-3;
  p.kv_block_cost_s = 1e-3 * (0.2 + std::uniform_real_distribution<double>(0, 2)(rng));
  const std::size_t min_bytes = std::size_t(L * p.min_slots) * p.expert_bytes +
                                std::size_t(p.kv_floor_blocks) * p.kv_block_bytes;
  const std::size_t max_bytes =
      std::size_t(L * E) * p.expert_bytes + std::size_t(kv_max) * p.kv_block_bytes;
  p.budget_bytes = min_bytes + rng() % (max_bytes - min_bytes + 1);
  return p;
}

}  // namespace ferry::serve::wsa::testing
