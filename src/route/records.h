// SPDX-License-Identifier: Apache-2.0
// Per-frame records for offline tuning and evaluation: a folder holding
//   gt.txt, weak.txt, strong.txt   the artifact's detection text format (detection.h)
//   frames.csv                     frame_id,split,<score columns...>  (split: calib | test)
// Score columns hold each estimator's per-frame score (e.g. `skip` from the pixel estimator, `cond`
// from the conditioned one). Loading validates that every score is finite and every frame id is
// unique; detections on frames not listed are rejected (kCorrupt) rather than silently dropped.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/result.h"
#include "route/detection.h"

namespace ferry::route {

struct RecordSet {
  std::vector<int> frames;                            // [N]
  std::vector<std::string> split;                     // [N]
  std::map<std::string, std::vector<double>> scores;  // column -> [N]
  std::vector<GroundTruth> gts;
  std::vector<Detection> weak, strong;

  // The subset of frames whose split equals `name` (detections filtered accordingly).
  RecordSet subset(const std::string& name) const;
};

Result<RecordSet> load_records(const std::string& dir);
Status save_records(const RecordSet& r, const std::string& dir);

}  // namespace ferry::route
