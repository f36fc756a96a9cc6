// SPDX-License-Identifier: Apache-2.0
// Offline replay over per-frame records: run a budget controller (fit on calibration scores) over
// a split in frame order, score the resulting weak/strong mix with the AP variants, and report the
// realised ratio, the modelled latency/compute and a bootstrap confidence interval.
// `tune` builds curves, envelope and router on the calibration split only; `eval` replays them on
// a disjoint test split (the artifact read its thresholds off its test curves: not repeated here).
// Scores are replaced by per-model percentile ranks over the evaluated split before mixing (the
// paper's convention), for all three metrics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "route/cost_model.h"
#include "route/curves.h"
#include "route/records.h"

namespace ferry::route {

enum class ControllerKind : std::uint8_t { kPaper, kFeedback };

struct ReplayOptions {
  std::vector<double> grid = {0, .1, .2, .3, .4, .5, .6, .7, .8, .9, 1};
  ControllerKind controller = ControllerKind::kFeedback;
  // 0 = auto: η = 1/(0.01·T − 1) for a split of T frames, the smallest gain whose bound
  // (controller.h) guarantees |realised − ρ| ≤ 0.01; needs T > 100.
  double feedback_gain = 0;
  int bootstrap = 0;  // resamples for the CI of mAP; 0 = none
  std::uint64_t seed = 1;
  CostModel cost;
};

struct ReplayRow {
  std::string estimator;
  double ratio = 0, map = 0, map_coco = 0, map_coco50 = 0;
  double realised = 0, latency_ms = 0, edge_gflops = 0;
  double ci_low = 0, ci_high = 0;
  Placement placement = Placement::kCond;
};
std::string replay_rows_to_csv(const std::vector<ReplayRow>& rows);
Curve curve_from_rows(const std::vector<ReplayRow>& rows);

// Fixed-placement replay: `column` scores drive the controller, calibrated on `calib_scores`.
Result<std::vector<ReplayRow>> replay_placement(const RecordSet& split, const std::string& name,
                                                Placement placement, const std::string& column,
                                                const std::vector<double>& calib_scores,
                                                const ReplayOptions& opts);

// A tuned router: placement table plus each placement's score column and calibration scores.
struct TunedRouter {
  Router table;
  std::string skip_column, cond_column;
  std::vector<double> skip_calibration, cond_calibration;
  Json to_json() const;
  static Result<TunedRouter> from_json(const Json& j);
};

// Adaptive replay: at each ρ the router picks the placement, whose controller then decides.
Result<std::vector<ReplayRow>> replay_router(const RecordSet& split, const TunedRouter& router,
                                             const ReplayOptions& opts);

struct TuneResult {
  std::vector<ReplayRow> skip_rows, cond_rows;
  Envelope envelope;
  TunedRouter router;       // accuracy envelope (paper rule, calibration data only)
  TunedRouter cost_router;  // cost-aware (lambda_per_ms)
};
Result<TuneResult> tune_router(const RecordSet& calib, const std::string& skip_column,
                               const std::string& cond_column, const ReplayOptions& opts,
                               double lambda_per_ms);

}  // namespace ferry::route
