// SPDX-License-Identifier: Apache-2.0
#include "serve/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace ferry::serve {

double log_sum_exp(std::span<const float> logits) {
  if (logits.empty()) return -std::numeric_limits<double>::infinity();
  float mx = -std::numeric_limits<float>::infinity();
  for (const float x : logits) mx = std::max(mx, x);
  if (!std::isfinite(mx)) return mx;  // all -inf (or a +inf/NaN row): nothing to normalise
  double sum = 0.0;
  for (const float x : logits) sum += std::exp(double(x) - double(mx));
  return double(mx) + std::log(sum);
}

TokenLogprob token_logprob(std::span<const float> logits, std::int32_t token, int top_n,
                           LogprobScratch& scratch) {
  const auto V = static_cast<std::int64_t>(logits.size());
  FERRY_CHECK(token >= 0 && token < V, "logprobs: token {} outside a row of {}", token, V);
  FERRY_CHECK(top_n >= 0 && top_n <= kMaxTopLogprobs, "logprobs: top_n {}", top_n);
  const double lse = log_sum_exp(logits);
  TokenLogprob out;
  out.token = token;
  out.logprob = static_cast<float>(double(logits[std::size_t(token)]) - lse);
  if (top_n == 0) return out;
  // Keep the n best (logit desc, id asc) in a min-heap ordered by "worse first".
  auto better = [](const std::pair<float, std::int32_t>& a,
                   const std::pair<float, std::int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  auto& h = scratch.heap;
  h.clear();
  const std::size_t n = std::min<std::size_t>(std::size_t(top_n), logits.size());
  for (std::int32_t j = 0; j < V; ++j) {
    const std::pair<float, std::int32_t> c{logits[std::size_t(j)], j};
    if (h.size() < n) {
      h.push_back(c);
      std::push_heap(h.begin(), h.end(), better);
    } else if (better(c, h.front())) {
      std::pop_heap(h.begin(), h.end(), better);
      h.back() = c;
      std::push_heap(h.begin(), h.end(), better);
    }
  }
  std::sort(h.begin(), h.end(), better);
  out.top.reserve(h.size());
  for (const auto& [x, id] : h) out.top.emplace_back(id, static_cast<float>(double(x) - lse));
  return out;
}

}  // namespace ferry::serve
