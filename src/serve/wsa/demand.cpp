// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/demand.h"

#include <algorithm>

#include "serve/wsa/convex_curve.h"

namespace ferry::serve::wsa {

ChunkMisses::ChunkMisses(int layers, int experts, double full_tokens)
    : experts_(experts),
      full_tokens_(full_tokens),
      pending_(std::size_t(layers), std::vector<double>(std::size_t(experts) + 2, 0.0)),
      full_(pending_),
      decode_(pending_) {}

void ChunkMisses::add_layer(int layer, std::span<const std::pair<int, int>> order) {
  std::vector<double>& h = pending_[std::size_t(layer)];
  for (const auto& [depth, item] : order) h[std::size_t(std::clamp(depth, 1, experts_ + 1))] += 1;
}

void ChunkMisses::end_step(double tokens, double prefill_tokens) {
  Hist* into = nullptr;
  if (tokens > 0 && prefill_tokens <= 0) {
    into = &decode_, decode_steps_ += 1;
  } else if (tokens > 0 && full_tokens_ > 0 && tokens >= full_tokens_) {
    into = &full_, full_steps_ += 1, full_prefill_ += prefill_tokens;
  }
  for (std::size_t l = 0; l < pending_.size(); ++l) {
    for (std::size_t d = 0; d < pending_[l].size(); ++d) {
      if (into != nullptr) (*into)[l][d] += pending_[l][d];
      pending_[l][d] = 0;
    }
  }
}

void ChunkMisses::scale(double f) {
  for (Hist* h : {&full_, &decode_}) {
    for (auto& v : *h) {
      for (double& x : v) x *= f;
    }
  }
  full_steps_ *= f, decode_steps_ *= f, full_prefill_ *= f;
}

std::vector<std::vector<double>> ChunkMisses::per_block(int block_tokens) const {
  std::vector<std::vector<double>> out;
  if (full_steps_ <= 0 || decode_steps_ <= 0 || full_prefill_ <= 0) return out;
  const double per = double(block_tokens) / (full_prefill_ / full_steps_);
  for (std::size_t l = 0; l < full_.size(); ++l) {
    std::vector<double> c(std::size_t(experts_) + 1, 0.0);
    double f = 0, d = 0;  // misses at capacity c: depths > c
    for (int cap = experts_; cap >= 0; --cap) {
      f += full_[l][std::size_t(cap) + 1];
      d += decode_[l][std::size_t(cap) + 1];
      c[std::size_t(cap)] = per * (f / full_steps_ - d / decode_steps_);
    }
    out.push_back(std::move(c));
  }
  return out;
}

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
                          int prefix_held_blocks, std::vector<double>* prefix_observed) {
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
  if (prefix_observed != nullptr) prefix_observed->clear();
  if (prefix != nullptr) {
    p.kv_prefix_misses = prefix->miss_curve();
    if (prefix_observed != nullptr) {  // the same products as below without the prior
      *prefix_observed = p.kv_prefix_misses;
      for (double& x : *prefix_observed) x *= per;
    }
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
