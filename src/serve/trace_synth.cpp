// SPDX-License-Identifier: Apache-2.0
#include "serve/trace_synth.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>
#include <set>

#include "serve/sampler.h"

namespace ferry::serve {
namespace {

// Inverse-CDF sampling from a fixed popularity table.
class Popularity {
 public:
  Popularity(int E, double s, bool uniform, Rng& rng) : cdf_(E) {
    std::vector<int> perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = E - 1; i > 0; --i) {
      std::swap(perm[i], perm[static_cast<int>(rng.next() % std::uint64_t(i + 1))]);
    }
    std::vector<double> w(E);
    for (int r = 0; r < E; ++r) w[perm[r]] = uniform ? 1.0 : 1.0 / std::pow(r + 1.0, s);
    double c = 0;
    for (int e = 0; e < E; ++e) cdf_[e] = (c += w[e]);
    for (double& x : cdf_) x /= c;
  }
  int draw(Rng& rng) const {
    const double u = rng.uniform();
    const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
    return std::min(static_cast<int>(it - cdf_.begin()), static_cast<int>(cdf_.size()) - 1);
  }

 private:
  std::vector<double> cdf_;
};

int pick_from(const std::vector<int>& pool, Rng& rng) {
  return pool[static_cast<std::size_t>(rng.next() % pool.size())];
}

}  // namespace

RoutingTrace make_synthetic_trace(const SyntheticTraceSpec& spec) {
  RoutingTrace t;
  t.experts = spec.experts;
  t.top_k = spec.top_k;
  Rng rng(spec.seed);
  for (int layer : spec.moe_layers) {
    const Popularity pop(spec.experts, spec.zipf_s, spec.spread, rng);
    for (int s = 0; s < spec.sessions; ++s) {
      std::deque<std::vector<int>> window;  // the last 8 tokens' experts, newest last
      const int n = spec.prefill_tokens + spec.decode_tokens;
      for (int pos = 0; pos < n; ++pos) {
        const bool prefill = pos < spec.prefill_tokens;
        const double p_rep = prefill ? spec.prefill_p_repeat : spec.p_repeat;
        const double p_win = prefill ? spec.prefill_reuse_within8 : spec.reuse_within8;
        std::vector<int> chosen;
        std::set<int> in_window;
        for (const auto& w : window) in_window.insert(w.begin(), w.end());
        const std::vector<int> prev = window.empty() ? std::vector<int>{} : window.back();
        auto taken = [&](int e) {
          return std::find(chosen.begin(), chosen.end(), e) != chosen.end();
        };
        while (static_cast<int>(chosen.size()) < spec.top_k) {
          int e = -1;
          const double r = rng.uniform();
          std::vector<int> pool;
          if (!spec.spread && r < p_rep) {
            for (int x : prev)
              if (!taken(x)) pool.push_back(x);
          } else if (!spec.spread && r < p_win) {
            for (int x : in_window) {
              if (!taken(x) && std::find(prev.begin(), prev.end(), x) == prev.end())
                pool.push_back(x);
            }
          }
          if (!pool.empty()) {
            e = pick_from(pool, rng);
          } else {
            // Fresh: a popularity draw, outside the window unless the spread profile (iid).
            for (int tries = 0; tries < 256 && e < 0; ++tries) {
              const int x = pop.draw(rng);
              if (taken(x) || (!spec.spread && in_window.count(x) != 0)) continue;
              e = x;
            }
            for (int x = 0; e < 0 && x < spec.experts; ++x) {
              if (!taken(x)) e = x;  // degenerate geometry (E ~ 8K): anything not chosen
            }
          }
          chosen.push_back(e);
        }
        t.routes[RouteKey{s, pos, layer}] = std::vector<std::int32_t>(chosen.begin(), chosen.end());
        window.push_back(chosen);
        if (window.size() > 8) window.pop_front();
      }
    }
  }
  return t;
}

LocalityStats measure_locality(const RoutingTrace& trace, int layer, int first_position,
                               int last_position) {
  LocalityStats st;
  std::int64_t rep = 0, win = 0;
  for (const auto& [key, ids] : trace.routes) {
    if (key.layer != layer || key.position < std::max(first_position, 8) ||
        key.position > last_position) {
      continue;
    }
    const auto prev_it = trace.routes.find({key.request, key.position - 1, layer});
    if (prev_it == trace.routes.end()) continue;
    std::set<int> w;
    bool full = true;
    for (int d = 1; d <= 8; ++d) {
      const auto it = trace.routes.find({key.request, key.position - d, layer});
      if (it == trace.routes.end()) {
        full = false;
        break;
      }
      w.insert(it->second.begin(), it->second.end());
    }
    if (!full) continue;
    for (std::int32_t e : ids) {
      rep += std::find(prev_it->second.begin(), prev_it->second.end(), e) != prev_it->second.end();
      win += w.count(e) != 0;
      ++st.picks;
    }
  }
  if (st.picks > 0) {
    st.repeat_next = double(rep) / double(st.picks);
    st.reuse_within8 = double(win) / double(st.picks);
  }
  return st;
}

}  // namespace ferry::serve
