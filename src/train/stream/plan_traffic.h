// SPDX-License-Identifier: Apache-2.0
// The plan's activation traffic next to what the streaming executor did (issue #7: "the executor
// performs exactly the transfers and recomputations the plan says (counted)"). The expectation
// comes from the plan's ActivationPolicy alone (boundary homes, spans, kept layers) and each
// micro-batch's token count, never from the executor's counters: per micro-batch of T tokens,
//   - each host or NVMe boundary leaves the device once and comes back once: T * C * 4 bytes each
//     way (boundaries are f32 on every backend; NVMe ones pass through the host staging buffer);
//   - each NVMe boundary is written and read once as a whole record of the store, sized for the
//     executor's largest micro-batch (max_tokens * C * 4 rounded up to NvmeStore::kIoAlignBytes);
//   - layer forwards: L (forward) + the spans' recomputes (one per recomputed boundary) + one
//     internals-only re-forward per layer not kept; each kept layer is counted as kept instead.
// The measured side is TransferStats' counters differenced over a step (recomputes: the forwards
// that are neither the forward pass nor a re-forward). `ferry train --plan` accumulates both per
// step, prints the run's totals with a mismatch flag at the end of the run (format_plan_traffic)
// and writes them to the metrics JSONL as {"type": "plan_traffic", ...} (plan_traffic_json).
// Tests: tests/unit/train/plan_traffic_test.cpp, tests/cli/train_plan_traffic.sh.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"
#include "train/stream/activation_policy.h"
#include "train/stream/stream_executor.h"

namespace ferry::train::stream {

// One step's (or one run's) activation traffic and layer passes.
struct TrafficCounts {
  std::uint64_t act_d2h_bytes = 0;       // boundaries off the device (host homes + NVMe staging)
  std::uint64_t act_h2d_bytes = 0;       // boundaries brought back for backward
  std::uint64_t nvme_write_bytes = 0;    // NVMe records written
  std::uint64_t nvme_read_bytes = 0;     // NVMe records read back
  std::uint64_t layer_forwards = 0;      // every layer forward pass, recomputes and re-forwards in
  std::uint64_t recompute_forwards = 0;  // of those, the spans' recomputes in backward
  std::uint64_t internals_forwards = 0;  // of those, the re-forwards right before a backward
  std::uint64_t kept_layers = 0;         // backwards that read kept internals (no re-forward)

  TrafficCounts& operator+=(const TrafficCounts& o);
  bool operator==(const TrafficCounts& o) const = default;
};

// What the plan says one micro-batch of `tokens` tokens moves and runs, for an executor sized
// for micro-batches of up to max_tokens (its NVMe records). hidden: C.
TrafficCounts expected_micro_batch(const ActivationPolicy& p, int hidden, std::int64_t tokens,
                                   std::int64_t max_tokens);

// TransferStats' cumulative counters (recompute_forwards 0: it is known only over whole
// micro-batches, see measured_between). Copies no per-window vector.
TrafficCounts traffic_counters(const TransferStats& s);
// The executor's traffic between two snapshots that enclose `micro_batches` whole micro-batches
// of an L-layer model: the differences, with recompute_forwards = the forwards that are neither
// the forward pass (L per micro-batch) nor a re-forward.
TrafficCounts measured_between(const TrafficCounts& before, const TrafficCounts& after, int layers,
                               std::int64_t micro_batches);

struct PlanTrafficReport {
  std::string policy;                                 // ActivationPolicy::describe()
  int device = 0, host = 0, nvme = 0, recompute = 0;  // boundary homes 0..L-1
  int kept = 0;                                       // kept layers
  std::int64_t steps = 0, micro_batches = 0, tokens = 0;
  TrafficCounts expected, measured;  // summed over the steps
  // Steps whose counts differ (each counter compared per step, not only the totals).
  std::int64_t mismatched_steps = 0;
  std::vector<std::int64_t> mismatched_step_ids;  // the first kMaxListed of them
  std::int64_t first_mismatch_step = 0;           // 0: none
  TrafficCounts first_mismatch_expected, first_mismatch_measured;
  static constexpr std::size_t kMaxListed = 16;

  bool match() const { return mismatched_steps == 0; }
};

PlanTrafficReport make_plan_traffic_report(const ActivationPolicy& p);
// Adds step `step` (micro_batches micro-batches of `tokens` tokens in all) to the report.
void add_step(PlanTrafficReport& r, std::int64_t step, std::int64_t micro_batches,
              std::int64_t tokens, const TrafficCounts& expected, const TrafficCounts& measured);

// Names of the counters differing between two counts ("act_d2h_bytes 10 != 12, ..."); "" if none.
std::string traffic_diff(const TrafficCounts& expected, const TrafficCounts& measured);
std::string format_plan_traffic(const PlanTrafficReport& r);
Json plan_traffic_json(const PlanTrafficReport& r);

}  // namespace ferry::train::stream
