// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/demand.h"

#include <algorithm>

#include "serve/wsa/convex_curve.h"

namespace ferry::serve::wsa {

void KvDemand::record(double blocks) {
  if (static_cast<int>(samples_.size()) < window_) {
    samples_.push_back(blocks);
    return;
  }
  samples_[next_] = blocks;
  next_ = (next_ + 1) % samples_.size();
}

double KvDemand::peak() const {
  return samples_.empty() ? 0.0 : *std::max_element(samples_.begin(), samples_.end());
}

SplitProblem make_problem(const CostModel& m, std::span<const StackDistance> layers, double steps,
                          std::span<const double> kv_samples, const PrefixStackDistance* prefix,
                          int prefix_held_blocks) {
  SplitProblem p;
  p.budget_bytes = m.budget_bytes;
  p.expert_bytes = m.expert_bytes;
  p.kv_block_bytes = m.kv_block_bytes;
  p.min_slots = m.min_slots;
  p.kv_floor_blocks = m.kv_floor_blocks;
  p.miss_cost_s = m.link_bytes_per_s > 0 ? double(m.expert_bytes) / m.link_bytes_per_s : 0.0;
  p.kv_block_cost_s = m.kv_block_cost_s;
  const double per = steps > 0 ? 1.0 / steps : 0.0;
  p.curve_steps = steps;
  for (const StackDistance& sd : layers) {
    std::vector<double> c = sd.miss_curve();
    for (double& x : c) x *= per;
    p.expert_misses.push_back(std::move(c));
  }
  p.kv_short = kv_shortage_curve(kv_samples, std::max(m.kv_max_blocks, m.kv_floor_blocks));
  if (prefix != nullptr) {
    p.kv_prefix_misses = prefix->miss_curve();
    if (m.prefix_reuse_prior) {
      const std::vector<double> prior = prefix->reuse_prior(prefix_held_blocks);
      for (std::size_t k = 0; k < prior.size(); ++k) p.kv_prefix_misses[k] += prior[k];
    }
    for (double& x : p.kv_prefix_misses) x *= per;
    p.prefix_block_cost_s = m.prefix_block_cost_s;
  }
  return p;
}

}  // namespace ferry::serve::wsa
