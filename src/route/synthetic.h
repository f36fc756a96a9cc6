// SPDX-License-Identifier: Apache-2.0
// Box-level synthetic scenes so tune/eval/demo run without VOC: each frame has a difficulty that
// sets object count, size and occlusion; the weak detector misses small and occluded objects and
// is less confident, the strong one mostly succeeds. Two synthetic estimators score each frame:
// `skip` sees only scene statistics a pixel model could see (object count, small-object share),
// `cond` sees only the weak detections (count, low-confidence share). Both are noisy.
// This generates records, not images: it is the fast path for tests and the server's replay. The
// drawn-image generator with real detectors is scene_images.h / scene_detectors.h.
#pragma once

#include <cstdint>

#include "route/records.h"

namespace ferry::route {

struct SyntheticOptions {
  int frames = 2000;
  double calib_fraction = 0.5;  // first part of the stream = calib, the rest = test
  double test_shift = 0.0;      // added to the test frames' difficulty (distribution shift)
  std::uint64_t seed = 1;
};

RecordSet make_synthetic_records(const SyntheticOptions& o);

}  // namespace ferry::route
