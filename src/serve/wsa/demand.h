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

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
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

// The price of one prompt token the prefix cache did not find: what recomputing it costs.
// A prompt that finds n blocks fewer cached computes n * block_tokens more tokens, and chunked
// prefill packs them into full chunks (max_batch_tokens per step, next to the running requests'
// decode tokens). Such a chunk does not add a step so much as turn a step the running requests
// take anyway into a prefill step: its price is what a full prefill step costs above a
// decode-only step, per prefill token in it,
//   per_token = (mean time of full steps - mean time of decode-only steps)
//               / mean prefill tokens of full steps,
// where a full step has prefill tokens and at least `full_tokens` tokens (the batch limit).
// NOTE(#9): the first version shared every step's time among its tokens (a prefill token cost
// step_s / tokens, averaged over all prefill). That overprices recomputation wherever the
// observed prefill comes in small chunks: a step's expert misses saturate at E per layer, so a
// 128-token chunk (a chat turn's new user tokens after a prefix hit) touches most of the
// experts a 512-token chunk does, and its misses, the step's base and the decode tokens' own
// misses were all charged to its few prefill tokens. On the phased 16 x 6 mix with short turns
// (docs/serve_wsa.md) it priced a block at 1.68 ms where recomputing one costs 1.08 ms (the
// simulator, with the prefix cache on vs off at the same split; this price: 1.11 ms), and the
// configurator kept 3,775 blocks for histories that expert slots outvalue (0.892x the oracle;
// now 1.000x). Without a full step yet, the old proportional share is the fallback; without a
// decode-only step, the baseline is 0. This price is the profile's, at its caps, while a chunk
// misses fewer experts at more slots (recomputing a block there costs 1.19 ms at 8 slots per
// layer, 1.09 at 21, 0.97 at 30): ChunkMisses below gives the misses part at every cap
// (allocate_priced_by_caps). Test: tests/unit/serve/wsa_prefill_price_test.cpp.
class PrefillCost {
 public:
  // full_tokens: a step with at least this many tokens is a full chunk (the scheduler's
  // max_batch_tokens; <= 0: no step counts as full, i.e. the proportional share).
  explicit PrefillCost(double full_tokens = 0) : full_tokens_(full_tokens) {}
  void add(double step_s, double tokens, double prefill_tokens) {
    if (tokens <= 0) return;
    time_s_ += step_s * prefill_tokens / tokens;
    tokens_ += prefill_tokens;
    if (prefill_tokens <= 0) {
      decode_steps_ += 1, decode_s_ += step_s;
    } else if (full_tokens_ > 0 && tokens >= full_tokens_) {
      full_steps_ += 1, full_s_ += step_s, full_prefill_ += prefill_tokens;
    }
  }
  double per_token_s(double fallback) const {
    if (full_steps_ > 0 && full_prefill_ > 0) {
      const double base = decode_steps_ > 0 ? decode_s_ / decode_steps_ : 0.0;
      return std::max(0.0, (full_s_ - base * full_steps_) / full_prefill_);
    }
    return proportional_s(fallback);
  }
  // The first version's price: the steps' time shared by token, averaged over prefill tokens.
  double proportional_s(double fallback) const {
    return tokens_ > 0 ? time_s_ / tokens_ : fallback;
  }
  void scale(double f) {
    time_s_ *= f, tokens_ *= f;
    decode_steps_ *= f, decode_s_ *= f;
    full_steps_ *= f, full_s_ *= f, full_prefill_ *= f;
  }

 private:
  double full_tokens_ = 0;
  double time_s_ = 0, tokens_ = 0;
  double decode_steps_ = 0, decode_s_ = 0;
  double full_steps_ = 0, full_s_ = 0, full_prefill_ = 0;
};

// What a recomputed prompt block costs in expert misses at each cap, per MoE layer. PrefillCost
// prices a block at the profiled split's caps; a full prefill chunk touches most experts of a
// layer and misses about E - C of them, so at more slots recomputing costs less (phased 12 x 6,
// simulator: 1.147 ms a block at 20 slots per layer, 1.013 at 34). The stack depths of a step's
// set (StackDistance::access_set's `order`: depth, or E + 1 for a first access) give a step's
// misses at every capacity c (depth > c), so keeping them apart for full chunks (prefill tokens
// and at least `full_tokens` tokens, as PrefillCost) and decode-only steps gives
//   per_block[l][c] = block_tokens x (full-chunk misses at c per full chunk
//                                      - decode-step misses at c per decode step)
//                     / prefill tokens per full chunk,
// PrefillCost's miss part at any cap: at the observed run's caps, miss_cost x sum_l per_block[l]
// equals it when the misses are the set model's (the simulator). A step's class is known only
// at its end (LiveSplit: the next step boundary), so its depths wait in `pending` until then.
// Used by allocate_priced_by_caps() (split_allocator.h). Tests: wsa_prefill_price_test.cpp.
class ChunkMisses {
 public:
  ChunkMisses() = default;
  ChunkMisses(int layers, int experts, double full_tokens);
  // One layer's step set as access_set left it in `order` ({depth or E + 1, item}).
  void add_layer(int layer, std::span<const std::pair<int, int>> order);
  // Ends the step (tokens and prefill tokens of it): its depths count for a full chunk, a
  // decode-only step, or nothing.
  void end_step(double tokens, double prefill_tokens);
  void scale(double f);
  // [L][E + 1] misses per recomputed block of `block_tokens` at each cap; empty without a full
  // chunk and a decode-only step.
  std::vector<std::vector<double>> per_block(int block_tokens) const;

 private:
  using Hist = std::vector<std::vector<double>>;  // [L][E + 2], depth 1..E, E + 1 first access
  int experts_ = 0;
  double full_tokens_ = 0;
  Hist pending_, full_, decode_;
  double full_steps_ = 0, decode_steps_ = 0, full_prefill_ = 0;
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
// prefix_observed (optional): set to the prefix curve per step without the prior -- bit for bit
// the kv_prefix_misses of the same call with m.prefix_reuse_prior off (empty without a prefix
// cache) -- so a caller that needs both (LiveSplit: the decision problem and the blocks the run
// itself recomputed) builds the problem once.
SplitProblem make_problem(const CostModel& m, std::span<const StackDistance> layers, double steps,
                          std::span<const double> kv_samples,
                          const PrefixStackDistance* prefix = nullptr, int prefix_held_blocks = 0,
                          std::vector<double>* prefix_observed = nullptr);

}  // namespace ferry::serve::wsa
