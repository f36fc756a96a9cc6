// SPDX-License-Identifier: Apache-2.0
// Victim choice of the expert pager. Each resident slot carries SlotMeta; the policy updates it on
// load and hit and ranks candidates. Ticks count acquire() calls of the slot's layer.
//   LRU  evict the smallest last_use.
//   LFU  evict the fewest uses since the expert was loaded; ties by last_use.
//   LFRU evict the smallest recency-decayed frequency, score(now) = score * 2^(-(now - at) / h),
//        where every access adds 1 (Lee et al.'s LRFU; h = half-life in ticks); ties by last_use.
//        The decay is lfru_decay below, computed so that the device resolver
//        (kernels/cuda/serve_slot_resolve.cu) gets the same bits: a table of 2^(-r/h), r < h,
//        scaled by an exact power of two; a hit's score is one fma.
// Every ranking ends in the slot index, so victim choice is deterministic.
#pragma once

#include <cstdint>
#include <vector>

#include "serve/serve_config.h"

namespace ferry::serve {

// 2^(-age / h) as ldexp(table[age % h], -(age / h)), table[r] = exp2(-r / h) (lfru_decay_table):
// exact scaling of a table value, so any IEEE machine with the table gets the same bits.
double lfru_decay(const double* table, int h, std::uint64_t age);
std::vector<double> lfru_decay_table(int h);

struct SlotMeta {
  std::uint64_t last_use = 0;
  std::uint64_t uses = 0;
  double score = 0.0;  // LFRU score as of score_at
  std::uint64_t score_at = 0;
};

class EvictionRanker {
 public:
  EvictionRanker(EvictionPolicy policy, int half_life)
      : policy_(policy), decay_(lfru_decay_table(half_life)) {}

  void on_load(SlotMeta& m, std::uint64_t now) const;
  void on_hit(SlotMeta& m, std::uint64_t now) const;
  // True when slot a (meta ma) should be evicted before slot b.
  bool evict_first(const SlotMeta& ma, int a, const SlotMeta& mb, int b, std::uint64_t now) const;
  double lfru_score(const SlotMeta& m, std::uint64_t now) const;
  EvictionPolicy policy() const { return policy_; }
  // [half_life] the LFRU decay table (lfru_decay_table); its length is the half-life.
  const std::vector<double>& decay_table() const { return decay_; }

 private:
  double decay(std::uint64_t age) const {
    return lfru_decay(decay_.data(), int(decay_.size()), age);
  }
  EvictionPolicy policy_;
  std::vector<double> decay_;
};

}  // namespace ferry::serve
