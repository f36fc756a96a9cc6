// SPDX-License-Identifier: Apache-2.0
// Victim choice of the expert pager. Each resident slot carries SlotMeta; the policy updates it on
// load and hit and ranks candidates. Ticks count acquire() calls of the slot's layer.
//   LRU  evict the smallest last_use.
//   LFU  evict the fewest uses since the expert was loaded; ties by last_use.
//   LFRU evict the smallest recency-decayed frequency, score(now) = score * 2^(-(now - at) / h),
//        where every access adds 1 (Lee et al.'s LRFU; h = half-life in ticks); ties by last_use.
// Every ranking ends in the slot index, so victim choice is deterministic.
#pragma once

#include <cstdint>

#include "serve/serve_config.h"

namespace ferry::serve {

struct SlotMeta {
  std::uint64_t last_use = 0;
  std::uint64_t uses = 0;
  double score = 0.0;  // LFRU score as of score_at
  std::uint64_t score_at = 0;
};

class EvictionRanker {
 public:
  EvictionRanker(EvictionPolicy policy, int half_life) : policy_(policy), half_life_(half_life) {}

  void on_load(SlotMeta& m, std::uint64_t now) const;
  void on_hit(SlotMeta& m, std::uint64_t now) const;
  // True when slot a (meta ma) should be evicted before slot b.
  bool evict_first(const SlotMeta& ma, int a, const SlotMeta& mb, int b, std::uint64_t now) const;
  double lfru_score(const SlotMeta& m, std::uint64_t now) const;
  EvictionPolicy policy() const { return policy_; }

 private:
  EvictionPolicy policy_;
  int half_life_;
};

}  // namespace ferry::serve
