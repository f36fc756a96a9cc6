// SPDX-License-Identifier: Apache-2.0
// Features of a frame's weak detections for the conditioned estimators (docs/route_estimators.md).
//
// cond_features: the 21 features the bgt-ada XGBoost estimator was trained on, in the model's
// column order (the artifact stores no feature names; the order is route.md's list, and the
// booster's split thresholds agree with it: column 0 splits at integers 3..73, columns 1-7 in
// [0.3, 1], 8-12 up to 5e5 px², 13-16 in pixels, 20 in [-1, 1]). Only detections with
// confidence >= min_confidence (0.3) count. Decisions where the artifact is silent:
//   - std is the population std (ddof = 0, numpy's default); quantiles interpolate linearly
//     between order statistics (numpy's default "linear" method);
//   - areas, centres and aspect are in pixels, not normalised (split thresholds reach 5e5 px²);
//     aspect = width / height (a zero-height box gives aspect 0);
//   - area CV = std(area) / mean(area), 0 when mean(area) is 0;
//   - correlation = Pearson of (confidence, area), 0 when either has zero variance (n < 2 too);
//   - a frame with no kept detection gives all 21 features = 0.
//
// edgeml_proposals: the EdgeML baseline's input, top-k (25) weak proposals by confidence (no
// threshold), each [confidence, centre x / W, centre y / H, width / W, height / H,
// width·height / (W·H)], zero-padded to k·6 values. The slot layout follows the DCSB checkpoint
// (stride 6, confidence at offset 0, area at 5) and the pickled StandardScaler's means (slot 0:
// 0.968, 0.50, 0.54, 0.52, 0.58, 0.35).
// Covered by tests/unit/route/features_test.cpp.
#pragma once

#include <array>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "route/detection.h"

namespace ferry::route {

inline constexpr int kNumCondFeatures = 21;
inline constexpr double kCondMinConfidence = 0.3;
using CondFeatures = std::array<double, kNumCondFeatures>;

// Column names, in model order.
const std::array<std::string_view, kNumCondFeatures>& cond_feature_names();

// `dets` are one frame's weak detections (any order; frame ids are not checked).
// kInvalidArgument when a score or box coordinate is not finite or a width/height is negative.
Result<CondFeatures> cond_features(const std::vector<Detection>& dets,
                                   double min_confidence = kCondMinConfidence);

inline constexpr int kEdgeMlProposals = 25;
inline constexpr int kEdgeMlStride = 6;

// [k * 6] floats (see above). kInvalidArgument on a non-positive image size or a bad detection.
Result<std::vector<float>> edgeml_proposals(const std::vector<Detection>& dets, double image_width,
                                            double image_height, int k = kEdgeMlProposals);

// Linear-interpolation quantile (numpy "linear") of an ascending-sorted, non-empty vector.
double sorted_quantile(const std::vector<double>& sorted, double q);

}  // namespace ferry::route
