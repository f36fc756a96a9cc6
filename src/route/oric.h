// SPDX-License-Identifier: Apache-2.0
// ORIC, the offload-benefit target of bgt-ada: for frame f of a context of N frames,
//   ORIC(f) = N · [AP((W ∖ D_w(f)) ∪ D_s(f)) − AP(W)]
// with AP the pooled, rank-normalised 11-point AP@.5 (ap.h; ranks are taken per model over the
// whole context, so swapping one frame never changes another detection's score).
//
// Why incremental: matching is per frame, so swapping frame f changes only f's entries of the
// ranked list. OricScorer matches every frame once for each model, keeps the weak list sorted, and
// scores a swap by one O(n) merge of that list (minus f's weak items) with f's sorted strong
// items. The full recomputation (re-match, re-rank, re-sort) is kept as the slow twin and the
// test checks both give the same value (tests/unit/route/oric_test.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/result.h"
#include "route/ap.h"
#include "route/detection.h"

namespace ferry::route {

struct OricOptions {
  double iou_threshold = 0.5;
  const ClassMap* class_map = nullptr;
  bool rank_normalize = true;
  ApInterp interp = ApInterp::k11Point;
};

class OricScorer {
 public:
  // frames: the context's frame ids (frames with no objects or detections still count in N).
  // Detections/GT on frames outside `frames` are ignored. Error if the context has no GT.
  static Result<OricScorer> build(const std::vector<int>& frames,
                                  const std::vector<GroundTruth>& gts,
                                  const std::vector<Detection>& weak,
                                  const std::vector<Detection>& strong, const OricOptions& opts);

  int num_frames() const { return static_cast<int>(frames_.size()); }
  int frame_id(int slot) const { return frames_[slot]; }
  double base_ap() const { return base_ap_; }
  double strong_ap() const;

  // AP((W ∖ D_w(f)) ∪ D_s(f)) for the frame in `slot` (0 ≤ slot < N), by one merge pass.
  double swapped_ap(int slot) const;
  // The same, recomputed from the detections (re-match, re-rank, re-sort): the slow twin.
  double swapped_ap_full(int slot) const;
  // ORIC for every frame, in slot order.
  std::vector<double> oric_all() const;

  // AP when the frames with offload[slot] != 0 use strong detections and the rest weak ones.
  double ap_with_offloaded(const std::vector<std::uint8_t>& offload) const;

 private:
  struct Item {
    double score;
    std::uint8_t tp;
    std::int32_t slot;
  };
  std::vector<int> frames_;
  std::vector<GroundTruth> gts_;
  std::vector<Detection> weak_, strong_;  // restricted to the context, scores rank-normalised
  std::vector<Item> weak_items_, strong_items_;          // sorted by descending score
  std::vector<std::vector<RankedItem>> strong_by_slot_;  // each sorted descending
  int npos_ = 0;
  double base_ap_ = 0;
  OricOptions opts_;
  mutable std::vector<RankedItem> scratch_;  // not thread-safe: one scorer per thread
};

// ORIC averaged over sampled contexts: each of `rounds` rounds shuffles `frames` (seeded) and cuts
// them into contexts of `context_size` frames (the remainder joins the last context), so every
// frame is scored exactly `rounds` times. Returns one value per entry of `frames`.
Result<std::vector<double>> oric_sampled(const std::vector<int>& frames,
                                         const std::vector<GroundTruth>& gts,
                                         const std::vector<Detection>& weak,
                                         const std::vector<Detection>& strong,
                                         const OricOptions& opts, int context_size, int rounds,
                                         std::uint64_t seed);

}  // namespace ferry::route
