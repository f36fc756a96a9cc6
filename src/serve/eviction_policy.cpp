// SPDX-License-Identifier: Apache-2.0
#include "serve/eviction_policy.h"

#include <cmath>
#include <tuple>

namespace ferry::serve {

double EvictionRanker::lfru_score(const SlotMeta& m, std::uint64_t now) const {
  const double age = static_cast<double>(now - m.score_at);
  return m.score * std::exp2(-age / static_cast<double>(half_life_));
}

void EvictionRanker::on_load(SlotMeta& m, std::uint64_t now) const {
  m = SlotMeta{.last_use = now, .uses = 1, .score = 1.0, .score_at = now};
}

void EvictionRanker::on_hit(SlotMeta& m, std::uint64_t now) const {
  m.score = lfru_score(m, now) + 1.0;
  m.score_at = now;
  m.last_use = now;
  ++m.uses;
}

bool EvictionRanker::evict_first(const SlotMeta& ma, int a, const SlotMeta& mb, int b,
                                 std::uint64_t now) const {
  switch (policy_) {
    case EvictionPolicy::kLru:
      return std::tie(ma.last_use, a) < std::tie(mb.last_use, b);
    case EvictionPolicy::kLfu:
      return std::tie(ma.uses, ma.last_use, a) < std::tie(mb.uses, mb.last_use, b);
    case EvictionPolicy::kLfru: {
      const double sa = lfru_score(ma, now), sb = lfru_score(mb, now);
      if (sa != sb) return sa < sb;
      return std::tie(ma.last_use, a) < std::tie(mb.last_use, b);
    }
  }
  return a < b;
}

}  // namespace ferry::serve
