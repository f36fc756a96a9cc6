// SPDX-License-Identifier: Apache-2.0
// The offline MV-WSA configurator (`ferry serve --plan-only --trace FILE --budget-gib X`): reads
// a routing trace (routing_trace.h), builds each MoE layer's exact LRU miss curve from its
// accesses (StackDistance over positions in (request, position) order, each position's top-k in
// routing order), turns the requests' lengths into a KV demand, and runs the allocator.
// Model of a step (the trace has no schedule): `concurrency` requests decode together, one token
// each, so misses per step = misses per token x concurrency; KV demand samples = the blocks of
// each window of `concurrency` consecutive requests (by id) at full length.
// Also prices the fixed splits (50/50, expert-heavy, KV-heavy, best uniform) on the same curves.
// The configurator is the benches' (split_allocator.h offline_split): priced by caps by default
// (TracePlanSpec::price_by_caps, `--configurator-price-by-caps on|off`). A routing trace has no
// prefix cache and no schedule (no prompt blocks, no prefill chunks), so its problem carries no
// per-cap recompute curves (has_cap_prices false) and on and off give the same split; a
// problem profiled by a run (split_profile.h) is where the cap-dependent price can differ.
#pragma once

#include <string>
#include <vector>

#include "core/result.h"
#include "model/model_compute.h"
#include "serve/routing_trace.h"
#include "serve/wsa/split_allocator.h"

namespace ferry::serve::wsa {

struct TracePlanSpec {
  std::size_t budget_bytes = 0;  // expert slots + KV blocks
  int bytes_per_param = 4;       // 4: this engine's f32 slots; 2 for a bf16 GPU engine
  int kv_bytes_per_elt = 0;      // a K/V element (KvConfig::dtype's size); 0: bytes_per_param
  int block_tokens = 16;
  int concurrency = 4;
  int max_context = 0;  // 0: the longest request in the trace
  double link_bytes_per_s = 24e9;
  double prefill_token_s = 2e-4;  // a missing KV block costs block_tokens x this per step
  // allocate_priced_by_caps (on) or allocate() at one price (off); the rows' step_s is the T
  // that configurator minimises (modelled_step_priced_by_caps_s / modelled_step_s).
  bool price_by_caps = true;
};

struct PlanRow {
  std::string name;
  Split split;
  double step_s = 0;
};

struct TracePlan {
  SplitProblem problem;
  std::vector<int> moe_layers;  // engine layer of each split entry
  PlanRow chosen;
  std::vector<PlanRow> fixed;  // 50/50, expert-heavy, kv-heavy, best uniform
};

Result<TracePlan> plan_from_trace(const RoutingTrace& trace, const model::DecoderGeometry& geo,
                                  const TracePlanSpec& spec);

}  // namespace ferry::serve::wsa
