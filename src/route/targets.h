// SPDX-License-Identifier: Apache-2.0
// Target transforms the estimators learn (route.md): MORIC = mid-rank ECDF of ORIC fit on the
// training split; MORIC+ = sign-preserving split ECDF on [−1, 1] (positives and negatives ranked
// separately, 0 stays 0); OffloadBin = 1[x > 0]; and the per-frame ablations CountGain (true
// positives gained) and F1Gain (F1 gained) at a confidence threshold.
// Tests: tests/unit/route/targets_test.cpp (OffloadBin checked against the artifact's own
// target_distributions.csv).
#pragma once

#include <span>
#include <vector>

#include "route/ap.h"
#include "route/detection.h"

namespace ferry::route {

// Mid-rank empirical CDF: u(x) = (#{c < x} + #{c ≤ x}) / (2|C|), in [0, 1].
class Ecdf {
 public:
  Ecdf() = default;
  explicit Ecdf(std::vector<double> values);  // copies and sorts
  double operator()(double x) const;
  std::size_t size() const { return sorted_.size(); }
  const std::vector<double>& sorted() const { return sorted_; }

 private:
  std::vector<double> sorted_;
};

// MORIC: ECDF of training ORIC values, applied to x.
class MoricTransform {
 public:
  explicit MoricTransform(std::vector<double> train_oric) : ecdf_(std::move(train_oric)) {}
  double operator()(double x) const { return ecdf_(x); }

 private:
  Ecdf ecdf_;
};

// MORIC+: x > 0 -> (#{p < x} + #{p ≤ x} + 1) / (2|P| + 1) over the positive training values P,
// in (0, 1]; x < 0 -> minus the same over the magnitudes of the negative ones; x == 0 -> 0.
// Monotone and sign-preserving (the +1 is a pseudo-observation at 0).
class MoricPlusTransform {
 public:
  explicit MoricPlusTransform(std::span<const double> train_oric);
  double operator()(double x) const;

 private:
  Ecdf pos_, neg_mag_;
};

inline double offload_bin(double x) { return x > 0 ? 1.0 : 0.0; }

// Per-frame gains of the strong over the weak detector on one frame, counting detections with
// score >= conf_threshold, matched at iou_threshold against class-compatible GT.
struct FrameGain {
  int tp_weak = 0, tp_strong = 0;
  double f1_weak = 0, f1_strong = 0;
  int count_gain() const { return tp_strong - tp_weak; }
  double f1_gain() const { return f1_strong - f1_weak; }
};
FrameGain frame_gain(const std::vector<GroundTruth>& frame_gts,
                     const std::vector<Detection>& frame_weak,
                     const std::vector<Detection>& frame_strong, double conf_threshold,
                     const MatchOptions& opts);

}  // namespace ferry::route
