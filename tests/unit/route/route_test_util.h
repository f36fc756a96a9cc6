// SPDX-License-Identifier: Apache-2.0
// Seeded random detection sets for route tests: per frame a few objects; the weak detector misses
// some and adds false positives, the strong one is closer to the truth. Also the shared-data path.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "route/detection.h"

namespace ferry::route::testing {

struct RandomSet {
  std::vector<int> frames;
  std::vector<GroundTruth> gts;
  std::vector<Detection> weak, strong;
};

inline RandomSet random_set(int num_frames, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  RandomSet s;
  const char* classes[] = {"a", "b", "c"};
  for (int f = 0; f < num_frames; ++f) {
    s.frames.push_back(f);
    const int objects = static_cast<int>(u(rng) * 5);
    for (int k = 0; k < objects; ++k) {
      const Box b{u(rng) * 200, u(rng) * 200, 10 + u(rng) * 40, 10 + u(rng) * 40};
      const std::string cls = classes[static_cast<int>(u(rng) * 3)];
      s.gts.push_back({f, k, b, cls, u(rng) < 0.05});
      for (int m = 0; m < 2; ++m) {
        const double miss = m == 0 ? 0.35 : 0.1, jitter = m == 0 ? 6 : 2;
        if (u(rng) < miss) continue;
        Box d = b;
        d.left += (u(rng) - 0.5) * jitter;
        d.top += (u(rng) - 0.5) * jitter;
        const std::string dc = u(rng) < (m == 0 ? 0.1 : 0.03) ? classes[(k + 1) % 3] : cls;
        const double score = m == 0 ? 0.3 + 0.6 * u(rng) : 0.5 + 0.5 * u(rng);
        (m == 0 ? s.weak : s.strong)
            .push_back({f, -1, d, score, dc, m == 0 ? Source::kWeak : Source::kStrong});
      }
    }
    const int fps = static_cast<int>(u(rng) * 3);  // false positives
    for (int k = 0; k < fps; ++k) {
      const Box b{u(rng) * 200, u(rng) * 200, 20, 20};
      const bool strong = u(rng) < 0.4;
      (strong ? s.strong : s.weak)
          .push_back(
              {f, -1, b, u(rng) * 0.7, classes[k % 3], strong ? Source::kStrong : Source::kWeak});
    }
  }
  return s;
}

// The artifact data beside the clone; tests fail (not skip) when it is missing.
inline std::string shared_dir() { return FERRY_SHARED_DIR; }

}  // namespace ferry::route::testing
