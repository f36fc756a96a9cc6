// SPDX-License-Identifier: Apache-2.0
// Replays the bgt-ada paper-data snapshot (shared/data/bgt-ada/paper-data): operating curves ->
// envelope, ρ_frontier/ρ_ceiling, AUCρ per estimator, peaks, and the cost figures of the latency
// model. Used by `ferry route paper` and tests/unit/route/paper_replay_test.cpp.
// NOTE(route): this reproduces the paper's numbers, flaws included: its thresholds come from the
// same test curves they are reported on. `ferry route tune`/`eval` split calibration and test.
#pragma once

#include <map>
#include <string>

#include "core/result.h"
#include "route/cost_model.h"
#include "route/curves.h"

namespace ferry::route {

inline constexpr const char* kPaperSkipEstimator =
    "pre|mobilenet_v2|OffloadBin|focal|online_ecdf_calibrated";
inline constexpr const char* kPaperCondEstimator = "post|xgboost|MORIC-AP|online_ecdf_calibrated";

struct PaperReplay {
  std::map<std::string, Curve> curves;
  Envelope envelope;
  std::map<std::string, double> auc;  // per estimator name, plus "adaptive"
  std::map<std::string, double> peak;
  CostModel cost;
  double rho_cost = 0.9;
  double saving_ms = 0, saving_pct = 0, gflops_saved = 0;
  double latency_break_even = 0, compute_break_even = 0, lightness = 0;
};

// dir: the paper-data folder (offloading_results.csv, estimator_metrics.csv).
Result<PaperReplay> replay_paper_data(const std::string& dir);

}  // namespace ferry::route
