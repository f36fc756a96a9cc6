// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/agentic_workload.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "serve/sampler.h"

namespace ferry::serve::wsa {
namespace {

int uniform_int(Rng& rng, int lo, int hi) {
  return lo + static_cast<int>(rng.next() % std::uint64_t(std::max(hi - lo + 1, 1)));
}

// One layer's calibrated routing over a session's positions (the algorithm of trace_synth.cpp,
// with counts instead of sets so Qwen3-30B-A3B geometry takes seconds, not minutes).
class LayerRouter {
 public:
  LayerRouter(const AgenticSpec& s, Rng& rng) : spec_(s), cdf_(std::size_t(s.experts)) {
    std::vector<int> perm(std::size_t(s.experts));
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = s.experts - 1; i > 0; --i) {
      std::swap(perm[std::size_t(i)], perm[rng.next() % std::uint64_t(i + 1)]);
    }
    double c = 0;
    std::vector<double> w(std::size_t(s.experts));
    for (int r = 0; r < s.experts; ++r)
      w[std::size_t(perm[std::size_t(r)])] = 1.0 / std::pow(r + 1.0, s.zipf_s);
    for (int e = 0; e < s.experts; ++e) cdf_[std::size_t(e)] = (c += w[std::size_t(e)]);
    for (double& x : cdf_) x /= c;
  }
  // Routes positions [0, kinds.size()) of one session; kinds[p]: true = decode locality.
  void route(const std::vector<bool>& decode, Rng& rng, std::uint8_t* out, std::size_t stride) {
    const int E = spec_.experts, K = spec_.top_k;
    std::vector<int> count(std::size_t(E), 0);  // uses in the last 8 tokens
    std::vector<std::vector<int>> window;       // ring of the last 8 tokens' picks
    std::vector<int> prev, pool, chosen;
    for (std::size_t p = 0; p < decode.size(); ++p) {
      const double p_rep = decode[p] ? spec_.p_repeat : spec_.prefill_p_repeat;
      const double p_win = decode[p] ? spec_.reuse_within8 : spec_.prefill_reuse_within8;
      chosen.clear();
      auto taken = [&](int e) {
        return std::find(chosen.begin(), chosen.end(), e) != chosen.end();
      };
      while (static_cast<int>(chosen.size()) < K) {
        const double r = rng.uniform();
        pool.clear();
        if (r < p_rep) {
          for (int x : prev) {
            if (!taken(x)) pool.push_back(x);
          }
        } else if (r < p_win) {
          for (const auto& w : window) {
            for (int x : w) {
              if (!taken(x) && std::find(prev.begin(), prev.end(), x) == prev.end() &&
                  std::find(pool.begin(), pool.end(), x) == pool.end()) {
                pool.push_back(x);
              }
            }
          }
        }
        int e = -1;
        if (!pool.empty()) {
          e = pool[rng.next() % pool.size()];
        } else {
          for (int tries = 0; tries < 256 && e < 0; ++tries) {
            const double u = rng.uniform();
            int x = static_cast<int>(std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
            x = std::min(x, E - 1);
            if (!taken(x) && count[std::size_t(x)] == 0) e = x;
          }
          for (int x = 0; e < 0 && x < E; ++x) {
            if (!taken(x)) e = x;
          }
        }
        chosen.push_back(e);
      }
      for (int k = 0; k < K; ++k)
        out[p * stride + std::size_t(k)] = std::uint8_t(chosen[std::size_t(k)]);
      for (int x : chosen) ++count[std::size_t(x)];
      window.push_back(chosen);
      if (window.size() > 8) {
        for (int x : window.front()) --count[std::size_t(x)];
        window.erase(window.begin());
      }
      prev = chosen;
    }
  }

 private:
  const AgenticSpec& spec_;
  std::vector<double> cdf_;
};

}  // namespace

AgenticWorkload::AgenticWorkload(const AgenticSpec& spec) : spec_(spec) {
  FERRY_CHECK(spec.experts > 0 && spec.experts <= 256 && spec.top_k <= spec.experts,
              "wsa: agentic routing needs 0 < top_k <= E <= 256, got E={} K={}", spec.experts,
              spec.top_k);
  Rng rng(spec.seed);
  turns_.resize(std::size_t(spec.sessions));
  std::vector<std::vector<bool>> decode(std::size_t(spec.sessions));
  for (int s = 0; s < spec.sessions; ++s) {
    const int jitter = spec.prefix_tokens / 8;
    int ctx = std::max(1, spec.prefix_tokens + uniform_int(rng, -jitter, jitter));
    std::vector<bool>& d = decode[std::size_t(s)];
    d.assign(std::size_t(ctx), false);
    for (int t = 0; t < spec.turns; ++t) {
      const bool long_phase = spec.phase_turns > 0 && (t / spec.phase_turns) % 2 == 1;
      const int out_lo = long_phase ? spec.long_output_min : spec.output_min;
      const int out_hi = long_phase ? spec.long_output_max : spec.output_max;
      AgenticTurn turn{.context = ctx,
                       .user = uniform_int(rng, spec.user_min, spec.user_max),
                       .output = uniform_int(rng, out_lo, out_hi),
                       .long_phase = long_phase};
      d.insert(d.end(), std::size_t(turn.user), false);
      d.insert(d.end(), std::size_t(turn.output), true);
      ctx = turn.prompt() + turn.output;
      turns_[std::size_t(s)].push_back(turn);
    }
  }
  // Popularity is the model's, shared by all sessions; each session has its own draws.
  std::vector<LayerRouter> layers;
  for (int l = 0; l < spec.moe_layers; ++l) layers.emplace_back(spec_, rng);
  routes_.resize(std::size_t(spec.sessions));
  const std::size_t stride = std::size_t(spec.moe_layers) * std::size_t(spec.top_k);
  for (int s = 0; s < spec.sessions; ++s) {
    const std::vector<bool>& d = decode[std::size_t(s)];
    routes_[std::size_t(s)].assign(d.size() * stride, 0);
    for (int l = 0; l < spec.moe_layers; ++l) {
      layers[std::size_t(l)].route(
          d, rng, routes_[std::size_t(s)].data() + std::size_t(l) * std::size_t(spec.top_k),
          stride);
    }
  }
}

int AgenticWorkload::session_tokens(int session) const {
  const AgenticTurn& t = turns_[std::size_t(session)].back();
  return t.prompt() + t.output;
}

int AgenticWorkload::max_context() const {
  int m = 0;
  for (int s = 0; s < sessions(); ++s) m = std::max(m, session_tokens(s));
  return m;
}

std::span<const std::uint8_t> AgenticWorkload::route(int session, int position, int layer) const {
  const std::size_t K = std::size_t(spec_.top_k);
  const std::size_t at =
      (std::size_t(position) * std::size_t(spec_.moe_layers) + std::size_t(layer)) * K;
  return {routes_[std::size_t(session)].data() + at, K};
}

std::vector<std::int32_t> AgenticWorkload::turn_prompt(int session, int turn, int vocab) const {
  const AgenticTurn& t = turns_[std::size_t(session)][std::size_t(turn)];
  std::vector<std::int32_t> ids(std::size_t(t.prompt()));
  for (int p = 0; p < t.prompt(); ++p) {
    // A fixed hash of (session, position): the same context is re-sent identically.
    std::uint64_t h = (std::uint64_t(session) << 32) ^ std::uint64_t(p);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    ids[std::size_t(p)] = static_cast<std::int32_t>((h ^ (h >> 31)) % std::uint64_t(vocab));
  }
  return ids;
}

std::vector<std::int32_t> AgenticWorkload::next_turn_prompt(int session, int turn,
                                                            std::span<const std::int32_t> prompt,
                                                            std::span<const std::int32_t> reply,
                                                            int vocab) const {
  std::vector<std::int32_t> next(prompt.begin(), prompt.end());
  next.insert(next.end(), reply.begin(), reply.end());
  const std::vector<std::int32_t> user = turn_prompt(session, turn + 1, vocab);
  if (user.size() > next.size()) {
    next.insert(next.end(), user.begin() + std::ptrdiff_t(next.size()), user.end());
  }
  return next;
}

}  // namespace ferry::serve::wsa
