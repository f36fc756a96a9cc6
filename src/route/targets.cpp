// SPDX-License-Identifier: Apache-2.0
// Target transforms (see targets.h).
#include "route/targets.h"

#include <algorithm>

namespace ferry::route {

Ecdf::Ecdf(std::vector<double> values) : sorted_(std::move(values)) {
  std::sort(sorted_.begin(), sorted_.end());
}

double Ecdf::operator()(double x) const {
  if (sorted_.empty()) return 0.5;
  const auto lo = std::lower_bound(sorted_.begin(), sorted_.end(), x) - sorted_.begin();
  const auto hi = std::upper_bound(sorted_.begin(), sorted_.end(), x) - sorted_.begin();
  return static_cast<double>(lo + hi) / (2.0 * static_cast<double>(sorted_.size()));
}

MoricPlusTransform::MoricPlusTransform(std::span<const double> train_oric) {
  std::vector<double> pos, neg;
  for (double v : train_oric) {
    if (v > 0) pos.push_back(v);
    if (v < 0) neg.push_back(-v);
  }
  pos_ = Ecdf(std::move(pos));
  neg_mag_ = Ecdf(std::move(neg));
}

namespace {
// Mid-rank ECDF with one pseudo-observation at 0: (#{< x} + #{≤ x} + 1) / (2n + 1), in (0, 1] for
// x > 0, so the smallest positive value never collapses to 0 and the sign is always preserved.
double positive_rank(const Ecdf& e, double x) {
  const double n = static_cast<double>(e.size());
  return (e(x) * 2.0 * n + 1.0) / (2.0 * n + 1.0);
}
}  // namespace

double MoricPlusTransform::operator()(double x) const {
  if (x > 0) return positive_rank(pos_, x);
  if (x < 0) return -positive_rank(neg_mag_, -x);
  return 0.0;
}

namespace {

void frame_tp(const std::vector<GroundTruth>& gts, const std::vector<Detection>& dets, double conf,
              const MatchOptions& opts, int& tp, double& f1) {
  std::vector<Detection> kept;
  for (const Detection& d : dets) {
    if (d.score >= conf) kept.push_back(d);
  }
  const std::vector<MatchFlag> flags = match_pooled(gts, kept, opts);
  tp = 0;
  int fp = 0, npos = 0;
  for (MatchFlag f : flags) tp += f == MatchFlag::kTp, fp += f == MatchFlag::kFp;
  for (const GroundTruth& g : gts) npos += !g.difficult;
  // F1 = 2TP / (2TP + FP + FN); an empty frame with no detections is a perfect 1.
  const int denom = 2 * tp + fp + (npos - tp);
  f1 = denom == 0 ? 1.0 : 2.0 * tp / denom;
}

}  // namespace

FrameGain frame_gain(const std::vector<GroundTruth>& frame_gts,
                     const std::vector<Detection>& frame_weak,
                     const std::vector<Detection>& frame_strong, double conf_threshold,
                     const MatchOptions& opts) {
  FrameGain g;
  frame_tp(frame_gts, frame_weak, conf_threshold, opts, g.tp_weak, g.f1_weak);
  frame_tp(frame_gts, frame_strong, conf_threshold, opts, g.tp_strong, g.f1_strong);
  return g;
}

}  // namespace ferry::route
