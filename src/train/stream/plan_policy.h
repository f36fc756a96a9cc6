// SPDX-License-Identifier: Apache-2.0
// Reads the activation policy out of a `ferry plan` JSON document (docs/plan.md, written by
// src/plan/plan_json.cpp): the "boundaries" homes gpu / host / nvme / recompute of boundaries
// 0..L-1 become an ActivationPolicy (boundary L always stays on the device), and the optional
// top-level "keep_internals" (L booleans, true/false or 0/1; absent = none) its kept layers
// (ActivationPolicy::keep; a wrong length is a corrupt plan), and the optional "resident_layers"
// (PlanPolicy::resident_layers). Only the document's
// public JSON is read, so ferry_train does not depend on the planner (and its solver) at all.
// What the executor does not follow yet is reported, not silently dropped: spans that keep their
// weights on the GPU run with re-streamed weights, and the per-window transfer schedule is
// replaced by "move each boundary right after it is produced / just before it is needed".
// Tests: tests/unit/train/stream_executor_test.cpp (StreamPolicy.*).
#pragma once

#include <string>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "train/stream/activation_policy.h"

namespace ferry::train::stream {

struct PlanPolicy {
  ActivationPolicy policy;
  int batch_size = 0;  // what the plan was solved for
  int seq_len = 0;
  int keep_weight_spans = 0;  // spans the plan runs with kept weights (executed re-streamed)
  // Decoder layers 0..K-1 GPU-resident ("resident_layers"; absent: 0): what ferry train --plan and
  // ferry bench train plan=FILE run unless --resident-layers is given.
  int resident_layers = 0;
  // The plan's prediction per compute window ([2L+1], plan/problem.h numbering; empty when the
  // document has none): what the trainer prints next to the measured window times.
  std::vector<double> window_compute_ms, window_exposed_ms;
  double predicted_step_ms = 0;
  // plan_fingerprint of the document: a bench report's run of it carries this, so `ferry plan
  // --evaluate` finds the run of this very document (not one with the same predicted step).
  std::string fingerprint;
};

// 16 hex digits of the FNV-1a 64 hash of the document's canonical dump (nlohmann's: keys sorted):
// the same for the same plan document wherever its file lies, different for any other content.
std::string plan_fingerprint(const Json& plan_doc);

// nvme_dir: where NVMe-homed boundaries go (the plan does not name a directory).
Result<PlanPolicy> read_plan_policy(const std::string& path, int layers,
                                    const std::string& nvme_dir);
// A plan document's "resident_layers" alone (absent: 0), before the model's depth is known
// (ferry train --plan applies it to its TrainConfig).
Result<int> read_plan_resident_layers(const std::string& path);
Result<PlanPolicy> plan_policy_from_text(const std::string& text, const std::string& what,
                                         int layers, const std::string& nvme_dir);

}  // namespace ferry::train::stream
