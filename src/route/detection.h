// SPDX-License-Identifier: Apache-2.0
// Detections and ground truth for routing: boxes, the artifact's text format
// (`frame_id,obj_id,left,top,width,height,confidence,class` per line) and the class-compatibility
// map that lets a COCO-named detector be scored against VOC-named ground truth.
// Boxes are continuous (left, top, width, height) in pixels; IoU uses no "+1" pixel convention.
// Covered by tests/unit/route/ap_test.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace ferry::route {

struct Box {
  double left = 0, top = 0, width = 0, height = 0;
};

// Intersection over union of two boxes; 0 when either has zero area.
double iou(const Box& a, const Box& b);

// Which detector produced a detection; rank normalisation in the pooled metric is per source.
enum class Source : std::uint8_t { kWeak = 0, kStrong = 1 };

struct Detection {
  int frame = 0;
  int obj = -1;
  Box box;
  double score = 0;  // detector confidence (or its rank-normalised replacement)
  std::string cls;
  Source source = Source::kWeak;
};

struct GroundTruth {
  int frame = 0;
  int obj = -1;
  Box box;
  std::string cls;
  bool difficult = false;  // matched difficult objects are neither TP nor FP (VOC rule)
};

// det class -> the ground-truth classes it may match. A class always matches itself.
class ClassMap {
 public:
  void add(std::string det_cls, std::string gt_cls);
  bool compatible(std::string_view det_cls, std::string_view gt_cls) const;
  bool empty() const { return map_.empty(); }
  // Parses lines "det_cls gt_cls" or "det_cls=gt_cls" ('#' comments, blank lines allowed).
  static Result<ClassMap> parse(std::string_view text, std::string_view what);
  static Result<ClassMap> load(const std::string& path);

 private:
  std::map<std::string, std::set<std::string>, std::less<>> map_;
};

// Parses the artifact's detection format. Lines may carry 8 fields; a trailing 9th field
// "difficult" (0/1) is accepted for ground truth. '#' lines and blank lines are skipped.
// Malformed lines give kCorrupt naming `what` and the line number.
Result<std::vector<Detection>> parse_detections(std::string_view text, std::string_view what,
                                                Source source);
Result<std::vector<GroundTruth>> parse_ground_truth(std::string_view text, std::string_view what);
Result<std::vector<Detection>> load_detections(const std::string& path, Source source);
Result<std::vector<GroundTruth>> load_ground_truth(const std::string& path);

// Writes detections back in the artifact format (round-trips through parse_detections).
std::string format_detections(const std::vector<Detection>& dets);
std::string format_ground_truth(const std::vector<GroundTruth>& gts);

}  // namespace ferry::route
