// SPDX-License-Identifier: Apache-2.0
#include "plan/choice.h"

#include <algorithm>

#include "core/check.h"

namespace ferry::plan {

Choice all_materialized(int num_layers, Home home) {
  FERRY_CHECK(num_layers >= 1 && home != Home::kRecompute, "plan: bad all_materialized call");
  Choice c;
  // Boundary 0 (the embedding's output) too, as the executor's host policy homes it; boundary L
  // feeds the loss on the GPU.
  c.homes.assign(num_layers + 1, home);
  c.homes[num_layers] = Home::kGpu;
  for (int i = 0; i < num_layers; ++i) c.spans.push_back(Span{i, i + 1, false});
  return c;
}

Choice checkpoint_every(int num_layers, int k, Home home) {
  FERRY_CHECK(num_layers >= 1 && k >= 1 && home != Home::kRecompute,
              "plan: bad checkpoint_every call");
  Choice c;
  c.homes.assign(num_layers + 1, Home::kRecompute);
  for (int s = 0; s < num_layers; s += k) {
    const int e = std::min(num_layers, s + k);
    c.homes[s] = home;
    c.spans.push_back(Span{s, e, false});
  }
  c.homes[num_layers] = Home::kGpu;
  return c;
}

namespace {

struct Enumerator {
  const PlanProblem& p;
  const std::function<void(const Choice&)>& visit;
  std::vector<Home> homes_available;
  Choice cur;
  long long count = 0;

  // Extends the path from boundary s; boundaries before s already have homes.
  void extend(int s) {
    const int L = p.num_layers;
    if (s == L) {
      ++count;
      visit(cur);
      return;
    }
    for (int e = s + 1; e <= std::min(L, s + p.max_span); ++e) {
      for (int keep = 0; keep <= (e - s >= 2 ? 1 : 0); ++keep) {
        cur.spans.push_back(Span{s, e, keep == 1});
        if (e == L) {
          extend(e);
        } else {
          for (Home h : homes_available) {
            cur.homes[e] = h;
            extend(e);
          }
          cur.homes[e] = Home::kRecompute;
        }
        cur.spans.pop_back();
      }
    }
  }
};

}  // namespace

long long for_each_choice(const PlanProblem& p, const std::function<void(const Choice&)>& visit) {
  Enumerator en{p, visit, {Home::kGpu, Home::kHost}, {}, 0};
  if (p.has_nvme()) en.homes_available.push_back(Home::kNvme);
  en.cur.homes.assign(p.num_layers + 1, Home::kRecompute);
  en.cur.homes[p.num_layers] = Home::kGpu;
  // Boundary 0 is always materialized (every path leaves it), in any tier.
  for (Home h : en.homes_available) {
    en.cur.homes[0] = h;
    en.extend(0);
  }
  return en.count;
}

}  // namespace ferry::plan
