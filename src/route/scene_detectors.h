// SPDX-License-Identifier: Apache-2.0
// Small detectors and estimators for the drawn scenes (scene_images.h), so that the whole routing
// pipeline — weak edge detector, pixel (skipping) estimator, detection-conditioned estimator,
// strong cloud detector, AP — runs on pixels on a CPU-only machine.
//
// The detector is a colour-segmentation detector: per class, a hue/saturation mask, an optional
// morphological opening, connected components, one box per component, confidence from the
// component's saturation and fill. The weak and strong detectors are the same algorithm at two
// operating points, as edge and cloud models are the same task at two capacities:
//   weak   = quarter resolution: cheap (≈1/16 of the pixels), loses most 5-10 px objects (or
//            reports them as low-confidence specks) and splits occluded ones;
//   strong = full resolution, light blur, no opening, merges the parts of an occluded object:
//            finds small and partly occluded objects.
// Estimators:
//   skip (pixel, before any detector): at half resolution, how many small saturated blobs and how
//        much high-frequency energy the frame has — what a pixel CNN could see;
//   cond (after the weak detector): low-confidence and small weak detections, and their count.
#pragma once

#include <vector>

#include <opencv2/core.hpp>

#include "route/detection.h"
#include "route/records.h"

namespace ferry::route {

struct ColorDetectorOptions {
  double scale = 1.0;       // resize factor before detection (0.25 = quarter resolution)
  int blur_kernel = 3;      // Gaussian kernel (odd, at the detection scale); 1 = none
  int open_kernel = 0;      // morphological opening kernel at the detection scale; 0 = none
  int min_area = 4;         // smallest component kept, pixels at the detection scale
  int min_saturation = 90;  // HSV saturation (0-255) a pixel needs to count as object colour
  // Same-class components whose boxes come within this many full-resolution pixels are merged
  // into one detection: an object cut in two by an occluder is still one object. 0 = never.
  int merge_gap = 0;
};

ColorDetectorOptions weak_detector_options();
ColorDetectorOptions strong_detector_options();

// Boxes in the full-resolution frame, sorted by descending confidence.
std::vector<Detection> detect_objects(const cv::Mat& bgr, int frame, Source source,
                                      const ColorDetectorOptions& o);

double skip_estimator_score(const cv::Mat& bgr);
double cond_estimator_score(const std::vector<Detection>& weak_dets);

struct SceneRecordOptions {
  int frames = 1200;
  double calib_fraction = 0.5;  // first part = calib, rest = test
  double test_shift = 0.0;      // added to the test frames' difficulty
  std::uint64_t seed = 1;
  std::string dump_dir;  // when set, every frame is also written there as frame_<id>.ppm
};

// Draws every frame, runs both detectors and both estimators on it, and returns the records
// (gt / weak / strong detections and the `skip` and `cond` score columns) that tune, eval, the
// demo and the cloud server consume.
Result<RecordSet> make_scene_records(const SceneRecordOptions& o);

}  // namespace ferry::route
