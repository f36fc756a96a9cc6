// SPDX-License-Identifier: Apache-2.0
// A trace-driven simulator of the serving loop that compares ways of splitting one budget between
// expert slots and KV blocks on the same workload (serve.md MV-WSA; `ferry bench serve-split`).
// It runs the engine's scheduler (engine.h with kv_preempt: FIFO admission of what is computed,
// block-by-block growth, youngest-first preemption and recompute; decode tokens first, then
// prompt chunks up to max_batch_tokens) over an AgenticWorkload, with one LRU expert cache per
// MoE layer at the split's caps, and charges each step a modelled time:
//   step_s = step_base_s + token_s * tokens + misses * expert_bytes / link_bytes_per_s
// (misses: per layer, the step's distinct experts not resident at the step's start -- one pager
// acquire of the set per layer and step, residents first; StackDistance::access_set's model).
// Nothing here is measured on a GPU: the three constants are inputs, and every figure it prints is
// a model output. Prefix cache (SimConfig::prefix_cache, the engine's KvConfig::prefix_cache): a
// turn's full blocks are identified by (session, block index) -- a session's position always holds
// the same token -- and kept after the turn ends, LRU, tail first, until a reservation needs them;
// a new turn (or a preempted one coming back) starts computing after its longest cached prefix,
// leaving at least its last token. Its miss curve over KV capacity (prefix_curve.h) and the
// observed prefill cost per token go into the profile and the live problems; a fixed split's
// profile also gets a recomputed block's misses at every cap (demand.h ChunkMisses).
// Policies: a fixed split, or live (LiveSplit's rule: Mattson curves + KV demand samples + with
// the prefix cache the prefix curve and its reuse prior (SimConfig::reuse_prior, fed the same
// Engine::final_blocks), the SplitController every decide_every_steps steps;
// shrinking evicts LRU-last experts, KV never below the blocks in use or the largest waiting
// request).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "serve/wsa/agentic_workload.h"
#include "serve/wsa/demand.h"
#include "serve/wsa/split_controller.h"

namespace ferry::serve::wsa {

struct SimConfig {
  std::size_t expert_bytes = 0;        // one expert (gate+up+down)
  std::size_t kv_bytes_per_token = 0;  // K and V of every layer
  int block_tokens = 16;
  std::size_t budget_bytes = 0;  // experts + KV (the total budget minus dense weights, workspace)
  int max_running = 4;
  int max_batch_tokens = 512;
  int kv_floor_blocks = 0;  // concurrency x max context, in blocks
  double link_bytes_per_s = 24e9;
  double step_base_s = 5e-3;
  double token_s = 1e-4;
  bool prefix_cache = false;
  // live policy: LiveSplitConfig's cadence (split_controller.h DecisionCadence; see the NOTE in
  // live_split.h): decide after >= min_decide_steps steps once
  // decide_accesses_per_expert x E expert accesses per MoE layer arrived (0: only every
  // decide_every_steps), at the latest every decide_every_steps; curves keep age_factor of their
  // weight per 64 steps.
  int decide_every_steps = 64;
  int min_decide_steps = 4;
  double decide_accesses_per_expert = 2;
  int warmup_steps = 0;  // no decision before this many steps (curves still recorded)
  double age_factor = 0.9;
  bool reuse_prior = true;  // the prefix curve's reuse prior (prefix_curve.h) in live problems
  ControllerConfig controller;
  CadenceConfig cadence(int experts) const {
    return {.min_steps = min_decide_steps,
            .max_steps = decide_every_steps,
            .accesses_per_decision = decide_accesses_per_expert * experts,
            .age_per_64_steps = age_factor};
  }
  std::size_t kv_block_bytes() const { return kv_bytes_per_token * std::size_t(block_tokens); }
  double kv_block_cost_s() const { return token_s * block_tokens; }
};

struct SimResult {
  double total_s = 0;              // end to end
  double mean_ttft_s = 0;          // turn arrival -> first token
  double decode_tokens_per_s = 0;  // generated tokens / total_s
  std::uint64_t steps = 0, misses = 0, accesses = 0, preemptions = 0, recompute_tokens = 0;
  std::uint64_t generated = 0, moves = 0;
  std::uint64_t prefill_tokens = 0;  // computed prompt (and recomputed) tokens
  // Prefix cache: full prompt blocks looked up at admission, found cached, evicted; and the
  // hits the stack model (prefix_curve.h) predicts at the pool's size of the moment.
  std::uint64_t prefix_query_blocks = 0, prefix_hit_blocks = 0, prefix_evictions = 0;
  std::uint64_t prefix_model_hit_blocks = 0;
  double prefix_hit_rate() const {
    return prefix_query_blocks ? double(prefix_hit_blocks) / double(prefix_query_blocks) : 0.0;
  }
  double hit_rate() const { return accesses ? 1.0 - double(misses) / double(accesses) : 0.0; }
  Split final_split;
  std::vector<DecisionRecord> log;  // live: every decision, in order
  double decide_s = 0;              // live: host time building problems and deciding (wall)
  // Profile for the offline configurator: per-step curves and KV demand samples of this run.
  SplitProblem profile;
};

// Runs the workload under a fixed split (live = false) or from `start` under the live controller.
Result<SimResult> simulate(const SimConfig& cfg, const AgenticWorkload& w, const Split& start,
                           bool live);
// The problem skeleton (budget, sizes, floor, costs) for this config; curves empty.
SplitProblem sim_problem(const SimConfig& cfg, int moe_layers, int experts, int top_k);

}  // namespace ferry::serve::wsa
