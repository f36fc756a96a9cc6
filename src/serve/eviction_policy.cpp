// SPDX-License-Identifier: Apache-2.0
#include "serve/eviction_policy.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace ferry::serve {

std::vector<double> lfru_decay_table(int h) {
  std::vector<double> t(std::size_t(std::max(h, 1)));
  for (std::size_t r = 0; r < t.size(); ++r) {
    t[r] = std::exp2(-static_cast<double>(r) / static_cast<double>(t.size()));
  }
  return t;
}

double lfru_decay(const double* table, int h, std::uint64_t age) {
  // Past 2^-1075 every table value (in (1/2, 1]) scales to 0; the cap keeps the exponent an int.
  const std::uint64_t q = std::min<std::uint64_t>(age / std::uint64_t(h), 2000);
  return std::ldexp(table[age % std::uint64_t(h)], -static_cast<int>(q));
}

double EvictionRanker::lfru_score(const SlotMeta& m, std::uint64_t now) const {
  return m.score * decay(now - m.score_at);
}

void EvictionRanker::on_load(SlotMeta& m, std::uint64_t now) const {
  m = SlotMeta{.last_use = now, .uses = 1, .score = 1.0, .score_at = now};
}

void EvictionRanker::on_hit(SlotMeta& m, std::uint64_t now) const {
  // One rounding (fma), as the device resolver does.
  m.score = std::fma(m.score, decay(now - m.score_at), 1.0);
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
