// SPDX-License-Identifier: Apache-2.0
#include "serve/logit_penalties.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace ferry::serve {

Status validate(const PenaltyParams& p, std::int64_t vocab) {
  // Sorted ids find a repeat in n log n (a client may send thousands of entries).
  std::vector<std::int32_t> ids;
  ids.reserve(p.logit_bias.size());
  for (const auto& [t, b] : p.logit_bias) {
    if (t < 0 || t >= vocab) {
      return invalid_argument("serve: logit_bias token {} is outside the vocabulary of {}", t,
                              vocab);
    }
    if (!(b >= -100.0f && b <= 100.0f)) {
      return invalid_argument("serve: logit_bias of token {} must be in [-100, 100], got {}", t, b);
    }
    ids.push_back(t);
  }
  std::sort(ids.begin(), ids.end());
  if (const auto rep = std::adjacent_find(ids.begin(), ids.end()); rep != ids.end()) {
    return invalid_argument("serve: logit_bias lists token {} twice", *rep);
  }
  if (!(p.repetition > 0.0f) || !std::isfinite(p.repetition)) {
    return invalid_argument("serve: repetition_penalty must be > 0 (1: off), got {}", p.repetition);
  }
  if (!(p.presence >= -2.0f && p.presence <= 2.0f)) {
    return invalid_argument("serve: presence_penalty must be in [-2, 2], got {}", p.presence);
  }
  if (!(p.frequency >= -2.0f && p.frequency <= 2.0f)) {
    return invalid_argument("serve: frequency_penalty must be in [-2, 2], got {}", p.frequency);
  }
  return ok_status();
}

void apply_penalties(std::span<float> row, const PenaltyParams& p,
                     std::span<const std::int32_t> prompt, std::span<const std::int32_t> generated,
                     PenaltyScratch& s) {
  if (!p.active()) return;
  const std::size_t V = row.size();
  if (s.count.size() != V) s.count.assign(V, 0);
  if (s.seen.size() != V) s.seen.assign(V, 0);
  auto check = [V](std::int32_t t) {
    FERRY_CHECK(t >= 0 && std::size_t(t) < V, "penalties: token {} outside a row of {}", t, V);
    return std::size_t(t);
  };
  if (p.repetition != 1.0f) {
    // Each distinct token once, in order of first occurrence (prompt, then generated).
    for (const auto ids : {prompt, generated}) {
      for (const std::int32_t t : ids) {
        const std::size_t i = check(t);
        if (s.seen[i]) continue;
        s.seen[i] = 1;
        row[i] = row[i] > 0.0f ? row[i] / p.repetition : row[i] * p.repetition;
      }
    }
    for (const auto ids : {prompt, generated}) {
      for (const std::int32_t t : ids) s.seen[std::size_t(t)] = 0;
    }
  }
  if (p.presence != 0.0f || p.frequency != 0.0f) {
    for (const std::int32_t t : generated) ++s.count[check(t)];
    for (const std::int32_t t : generated) {
      const std::size_t i = std::size_t(t);
      if (s.count[i] == 0) continue;  // already applied for this token
      row[i] -= p.presence + p.frequency * static_cast<float>(s.count[i]);
      s.count[i] = 0;
    }
  }
  for (const auto& [t, b] : p.logit_bias) row[check(t)] += b;
}

}  // namespace ferry::serve
