// SPDX-License-Identifier: Apache-2.0
// Detection accuracy metrics: class-aware greedy matching, PASCAL VOC AP (VOC07 11-point, VOC12
// all-point; per class, then mean), COCO-style AP@[.5:.95] and AP@.5 (101-point), and the
// bgt-ada paper's pooled, rank-normalised 11-point AP@.5 (one PR curve over all classes).
//
// Conventions (the same for every metric, so numbers are comparable and order-independent):
// - detections with equal scores form one threshold step: precision/recall are only read after a
//   whole tie group (sklearn-style), so input order never changes an AP;
// - recall thresholds are compared in integers (10·tp ≥ k·npos), so 0.3 means 3/10 exactly;
// - matching is per frame, in descending score order. kVoc: a detection takes the compatible GT of
//   highest IoU; if that GT is already taken the detection is a false positive (a duplicate).
//   kCoco: it takes the best still-unmatched GT. Matched "difficult" GT is neither TP nor FP.
// Hand-computed cases: tests/unit/route/ap_test.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/result.h"
#include "route/detection.h"

namespace ferry::route {

enum class MatchRule : std::uint8_t { kVoc, kCoco };
enum class MatchFlag : std::uint8_t { kFp = 0, kTp = 1, kIgnore = 2 };

struct MatchOptions {
  double iou_threshold = 0.5;
  MatchRule rule = MatchRule::kVoc;
  const ClassMap* class_map = nullptr;  // nullptr: a class matches only itself
};

// One detection on the ranked list: its score and whether it was a true positive.
struct RankedItem {
  double score = 0;
  std::uint8_t tp = 0;
};

enum class ApInterp : std::uint8_t { k11Point, kAllPoint, k101Point };

// Sorts by descending score (ties keep no particular order: ap_sorted groups them).
void sort_ranked(std::vector<RankedItem>& items);
// AP of a list already sorted by descending score; npos = number of (non-difficult) GT objects.
// npos must be > 0 (a bug otherwise).
double ap_sorted(std::span<const RankedItem> items, int npos, ApInterp interp);

// Matches all detections against the ground truth frame by frame, any compatible class (the
// pooled setting). Returns one flag per detection, aligned with `dets`.
std::vector<MatchFlag> match_pooled(const std::vector<GroundTruth>& gts,
                                    const std::vector<Detection>& dets, const MatchOptions& opts);

// Mid-rank percentile of each score within its own list: (#{< s} + #{≤ s}) / (2n).
std::vector<double> rank_normalize(std::span<const double> scores);
// Replaces scores by their percentile rank within the detections of the same Source.
void rank_normalize_per_source(std::vector<Detection>& dets);

enum class ApMetric : std::uint8_t { kVoc07, kVoc12, kCoco, kCoco50, kPooled11 };
Result<ApMetric> parse_ap_metric(std::string_view name);
std::string_view to_string(ApMetric m);

struct ApOptions {
  double iou_threshold = 0.5;           // VOC and pooled metrics; COCO sweeps .50:.05:.95
  const ClassMap* class_map = nullptr;  // det class -> compatible GT classes
  bool rank_normalize = true;           // pooled metric: per-source percentile ranks
  int coco_max_dets = 100;              // COCO: top detections kept per frame and class
};

struct ApReport {
  ApMetric metric = ApMetric::kVoc07;
  double mean = 0;  // mAP over GT classes (pooled: the single pooled AP)
  std::vector<std::pair<std::string, double>> per_class;  // empty for pooled
  int num_gt = 0;                                         // non-difficult GT objects
  int num_det = 0;
};

// Errors: kInvalidArgument when there is no non-difficult ground truth to score against.
Result<ApReport> evaluate_ap(const std::vector<GroundTruth>& gts,
                             const std::vector<Detection>& dets, ApMetric metric,
                             const ApOptions& opts);

}  // namespace ferry::route
