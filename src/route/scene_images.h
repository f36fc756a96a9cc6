// SPDX-License-Identifier: Apache-2.0
// Drawn synthetic scenes: the pipeline end to end on pixels, without VOC.
//
// Each frame is an image (BGR, 8 bit) of a textured grey background with objects of three
// classes, told apart by colour and shape (car: red rectangle, person: green ellipse, bike: blue
// rectangle). A per-frame difficulty in [0, 1] raises the object count, the share of small
// objects (5-10 px), partial occlusion by grey occluders and sensor noise — the three things that
// make the weak edge detector (scene_detectors.h, at quarter resolution) miss objects that the
// strong cloud detector (full resolution) still finds. Ground truth keeps each object's full box
// (VOC convention: occluded objects keep their extent); objects more than 70 % covered are marked
// difficult. Deterministic: a frame depends only on (seed, frame index, difficulty).
#pragma once

#include <cstdint>
#include <vector>

#include <opencv2/core.hpp>

#include "route/detection.h"

namespace ferry::route {

inline constexpr const char* kSceneClasses[3] = {"car", "person", "bike"};

struct SceneOptions {
  int width = 320;
  int height = 240;
};

struct Scene {
  cv::Mat image;  // CV_8UC3, height x width
  std::vector<GroundTruth> gts;
  int small_objects = 0;  // objects drawn at 5-10 px (for tests and reports, not estimators)
};

Scene render_scene(int frame, double difficulty, std::uint64_t seed, const SceneOptions& o = {});

// Binary PPM (P6) so frames can be looked at without an image codec library.
Status write_ppm(const cv::Mat& bgr, const std::string& path);

}  // namespace ferry::route
