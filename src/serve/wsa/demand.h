// SPDX-License-Identifier: Apache-2.0
// The two demand signals MV-WSA reads while serving, and their conversion into a SplitProblem:
//   - expert demand: one StackDistance per MoE layer (exact LRU miss curves), aged by halving
//     its counts every window so the curves follow the workload;
//   - KV demand: per-step samples of the blocks the engine wanted, = blocks in use + blocks the
//     waiting queue needs to be admitted + blocks freed by preemptions this step (work that has
//     to be redone), kept in a ring of the last `kv_window` steps. The shortage curve
//     E[max(0, demand - k)] says how many blocks would be missing per step at k blocks.
// The admission floor is concurrency x max context, in blocks (configurable), below which the
// scheduler would refuse or thrash; the allocator never goes under it.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "serve/wsa/prefix_curve.h"
#include "serve/wsa/split_allocator.h"
#include "serve/wsa/stack_distance.h"

namespace ferry::serve::wsa {

struct CostModel {
  std::size_t budget_bytes = 0;  // experts + KV
  std::size_t expert_bytes = 0;
  std::size_t kv_block_bytes = 0;
  int min_slots = 1;
  int kv_floor_blocks = 0;
  int kv_max_blocks = 0;           // the KV curve's end (the whole budget in blocks is enough)
  double link_bytes_per_s = 24e9;  // expert miss = expert_bytes / link
  // One KV block missing for one step: its block_tokens positions are recomputed (preemption)
  // or wait (queueing); either way about block_tokens x the per-token prefill time.
  double kv_block_cost_s = 0;
  // Prefix cache: one prompt block not found cached costs its prefill, block_tokens x the
  // observed prefill cost per token (prefill_token_cost_s below); 0: no prefix cache.
  double prefix_block_cost_s = 0;
  // Live only: add the prefix curve's reuse prior (prefix_curve.h) for the chains the pool holds
  // now, so blocks that have not been reused yet keep a value before their sessions come back.
  bool prefix_reuse_prior = false;
};

// Prefill cost per token from a step's modelled or measured time: the step's time is shared
// among its tokens in proportion (decode and prefill alike), so a prefill token costs
// step_s / tokens. Accumulate with add(), read with per_token_s().
class PrefillCost {
 public:
  void add(double step_s, double tokens, double prefill_tokens) {
    if (tokens <= 0) return;
    time_s_ += step_s * prefill_tokens / tokens;
    tokens_ += prefill_tokens;
  }
  double per_token_s(double fallback) const { return tokens_ > 0 ? time_s_ / tokens_ : fallback; }
  void scale(double f) { time_s_ *= f, tokens_ *= f; }

 private:
  double time_s_ = 0, tokens_ = 0;
};

class KvDemand {
 public:
  explicit KvDemand(int window = 512) : window_(window) {}
  void record(double blocks);
  std::span<const double> samples() const { return samples_; }
  double peak() const;

 private:
  int window_;
  std::size_t next_ = 0;
  std::vector<double> samples_;
};

// Curves per step: expert misses divided by `steps` (the steps the histograms cover); the
// prefix cache's miss curve likewise (prefix: null without a prefix cache), plus its reuse prior
// when m.prefix_reuse_prior, with `prefix_held_blocks` the blocks running and queued requests
// hold or need now (the engine's KvDemandSample::blocks()).
SplitProblem make_problem(const CostModel& m, std::span<const StackDistance> layers, double steps,
                          std::span<const double> kv_samples,
                          const PrefixStackDistance* prefix = nullptr, int prefix_held_blocks = 0);

}  // namespace ferry::serve::wsa
