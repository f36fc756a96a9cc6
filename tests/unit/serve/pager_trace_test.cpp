// SPDX-License-Identifier: Apache-2.0
// The pager alone on synthetic decode traces in Qwen3-30B-A3B routing geometry (128 experts,
// top-8; experts shrunk to C = 8, F = 4 so the copies are cheap): hit rates per policy and cap,
// printed for docs/serve.md, with the properties that must hold:
//   - the calibrated trace hits far more than the spread (stress) trace at a partial cap;
//   - with every expert resident only compulsory misses remain;
//   - LRU's hit rate does not fall as the cap grows (LRU is a stack algorithm).
#include <cstdio>
#include <set>

#include "serve/builtin_model.h"
#include "serve/expert_pager.h"
#include "serve/trace_synth.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

double hit_rate(const ExpertStore& store, const RoutingTrace& t, int cap, EvictionPolicy p) {
  auto pager = ExpertPager::create(store, {.caps = {cap}, .policy = p});
  EXPECT_TRUE(pager.ok()) << pager.status().to_string();
  std::vector<ExpertRef> refs(t.top_k);
  for (const auto& [key, ids] : t.routes) {  // ordered by request, then position
    if (key.position < 32) continue;         // skip the prefill burst: decode only
    EXPECT_TRUE((*pager)->acquire(0, ids, refs).ok());
    (*pager)->release(0);
  }
  return (*pager)->counters().hit_rate();
}

TEST(PagerOnTraces, CalibratedLocalityPaysSpreadDoesNot) {
  auto m = make_builtin_moe({.vocab = 16,
                             .layers = 1,
                             .hidden = 8,
                             .heads = 1,
                             .kv_heads = 1,
                             .head_dim = 8,
                             .experts = 128,
                             .top_k = 8,
                             .expert_width = 4},
                            3);
  ASSERT_TRUE(m.ok());
  auto store = ExpertStore::create((*m)->geometry, (*m)->params);
  ASSERT_TRUE(store.ok());
  SyntheticTraceSpec spec{.experts = 128,
                          .top_k = 8,
                          .moe_layers = {0},
                          .sessions = 1,
                          .prefill_tokens = 32,
                          .decode_tokens = 1500,
                          .seed = 21};
  const RoutingTrace calibrated = make_synthetic_trace(spec);
  spec.spread = true;
  const RoutingTrace spread = make_synthetic_trace(spec);
  double prev_lru = 0;
  std::printf("cap  lru(cal) lfu(cal) lfru(cal) lru(spread)\n");
  for (int cap : {8, 16, 32, 51, 64, 96, 128}) {
    const double lru = hit_rate(**store, calibrated, cap, EvictionPolicy::kLru);
    const double lfu = hit_rate(**store, calibrated, cap, EvictionPolicy::kLfu);
    const double lfru = hit_rate(**store, calibrated, cap, EvictionPolicy::kLfru);
    const double lru_spread = hit_rate(**store, spread, cap, EvictionPolicy::kLru);
    std::printf("%3d  %.3f    %.3f    %.3f     %.3f\n", cap, lru, lfu, lfru, lru_spread);
    EXPECT_GE(lru + 1e-12, prev_lru) << "LRU hit rate fell from cap " << cap;
    prev_lru = lru;
    if (cap == 32) {
      EXPECT_GT(lru, lru_spread + 0.3) << "locality did not pay at cap 32";
    }
    if (cap == 128) {
      // Only the first use of each expert misses.
      std::set<int> used;
      for (const auto& [key, ids] : calibrated.routes) {
        if (key.position >= 32) used.insert(ids.begin(), ids.end());
      }
      EXPECT_DOUBLE_EQ(lru, 1.0 - double(used.size()) / (1500.0 * 8));
      EXPECT_EQ(lru, lfu);
    }
  }
}

}  // namespace
}  // namespace ferry::serve
