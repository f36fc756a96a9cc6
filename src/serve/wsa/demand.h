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

// Curves per step: expert misses divided by `steps` (the steps the histograms cover).
SplitProblem make_problem(const CostModel& m, std::span<const StackDistance> layers, double steps,
                          std::span<const double> kv_samples);

}  // namespace ferry::serve::wsa
