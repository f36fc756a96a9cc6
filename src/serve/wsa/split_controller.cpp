// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/split_controller.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>

namespace ferry::serve::wsa {

bool DecisionCadence::step(double accesses, int layers) {
  ++steps_;
  accesses_ += accesses;
  const int max_steps = std::max(cfg_.max_steps, 1);
  const int min_steps = std::clamp(cfg_.min_steps, 1, max_steps);
  if (steps_ < min_steps) return false;
  if (steps_ >= max_steps) return true;
  return cfg_.accesses_per_decision > 0 &&
         accesses_ >= cfg_.accesses_per_decision * double(std::max(layers, 1));
}

double DecisionCadence::decided() {
  const double f = std::pow(cfg_.age_per_64_steps, double(steps_) / 64.0);
  steps_ = 0;
  accesses_ = 0;
  return f;
}

double SplitController::migration_s(const SplitProblem& p, const Split& from,
                                    const Split& to) const {
  if (cfg_.link_bytes_per_s <= 0) return 0;
  std::size_t slots = 0;
  for (std::size_t l = 0; l < from.slots.size() && l < to.slots.size(); ++l) {
    slots += std::size_t(std::abs(from.slots[l] - to.slots[l]));
  }
  return double(slots) * double(p.expert_bytes) / cfg_.link_bytes_per_s;
}

double SplitController::gain_stderr_s(const SplitProblem& p, const Split& a, const Split& b) {
  if (p.curve_steps <= 0) return 0;
  // Variance of a count difference ~ the count between the two capacities (Poisson), per curve,
  // weighted by its cost squared; the curves are per step, so counts = curve x curve_steps.
  double var = 0;
  for (std::size_t l = 0; l < p.expert_misses.size(); ++l) {
    const std::vector<double>& m = p.expert_misses[l];
    const double dm = std::abs(m[std::size_t(a.slots[l])] - m[std::size_t(b.slots[l])]);
    var += p.miss_cost_s * p.miss_cost_s * dm;
  }
  auto at = [](const std::vector<double>& c, int k) {
    return c.empty() ? 0.0 : c[std::size_t(std::clamp(k, 0, static_cast<int>(c.size()) - 1))];
  };
  var += p.kv_block_cost_s * p.kv_block_cost_s *
         std::abs(at(p.kv_short, a.kv_blocks) - at(p.kv_short, b.kv_blocks));
  var += p.prefix_block_cost_s * p.prefix_block_cost_s *
         std::abs(at(p.kv_prefix_misses, a.kv_blocks) - at(p.kv_prefix_misses, b.kv_blocks));
  // var is per step and count-weighted / curve_steps: the mean's variance is var / curve_steps.
  return std::sqrt(var / p.curve_steps);
}

double SplitController::unavoidable_s(const SplitProblem& p) {
  double t = kv_side_s(p, p.kv_max_blocks());
  for (const std::vector<double>& m : p.expert_misses) {
    if (!m.empty()) t += p.miss_cost_s * m.back();
  }
  return t;
}

bool SplitController::priced_by_caps(const SplitProblem& p) const {
  return cfg_.price_by_caps && has_cap_prices(p);
}

double SplitController::step_s(const SplitProblem& p, const Split& s) const {
  return priced_by_caps(p) ? modelled_step_priced_by_caps_s(p, s) : modelled_step_s(p, s);
}

Result<Decision> SplitController::decide(const SplitProblem& p, const Split& current) const {
  Decision d;
  const bool priced = priced_by_caps(p);
  if (priced) {
    FERRY_ASSIGN_OR_RETURN(
        d.target, allocate_priced_by_caps(p, cfg_.allocator,
                                          {.fixed_point_rounds = 2, .every_uniform_start = false}));
  } else {
    FERRY_ASSIGN_OR_RETURN(d.target, allocate(p, cfg_.allocator));
  }
  d.optimum_s = d.target_s = step_s(p, d.target);
  double floor_s = unavoidable_s(p);
  if (priced) {  // U at E slots per layer and the whole KV curve, the block at those caps
    const Split all{.slots = std::vector<int>(p.expert_misses.size(), p.experts()),
                    .kv_blocks = p.kv_max_blocks()};
    floor_s = modelled_step_priced_by_caps_s(p, all);
  }
  d.floor_s = cfg_.of_avoidable ? std::min(floor_s, d.optimum_s) : 0.0;
  if (cfg_.uniform_tie > 0) {
    // The best uniform split within the tie band -- or the current split, if it is one of them
    // (staying costs nothing).
    std::optional<Split> pick;
    double pick_s = 0;
    for (Split& u : all_uniform_splits(p)) {
      const double t = step_s(p, u);
      if (t - d.floor_s > (d.optimum_s - d.floor_s) * (1 + cfg_.uniform_tie)) continue;
      if (u == current || !pick || t < pick_s) {
        pick = std::move(u);
        pick_s = t;
        if (*pick == current) break;
      }
    }
    if (pick) d.target = std::move(*pick), d.target_s = pick_s;
  }
  d.current_s = step_s(p, current);
  d.migration_s = migration_s(p, current, d.target);
  d.stderr_s = gain_stderr_s(p, current, d.target);
  const double gain = d.current_s - d.target_s;
  const double avoidable = std::max(d.current_s - d.floor_s, 0.0);
  d.band = cfg_.hysteresis;
  if (d.stderr_s > 0 && avoidable > 0 && cfg_.min_hysteresis < cfg_.hysteresis) {
    d.band = std::clamp(cfg_.confidence_z * d.stderr_s / avoidable, cfg_.min_hysteresis,
                        cfg_.hysteresis);
  }
  d.threshold_s = d.band * avoidable;
  // An infeasible current split (e.g. the first decision after a floor change) always moves.
  d.move = !feasible(p, current) || (d.target != current && gain >= d.threshold_s && gain > 0 &&
                                     gain * cfg_.horizon_steps >= d.migration_s);
  return d;
}

}  // namespace ferry::serve::wsa
