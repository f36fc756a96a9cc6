// SPDX-License-Identifier: Apache-2.0
// Box-level synthetic scene generator (see synthetic.h).
#include "route/synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace ferry::route {

RecordSet make_synthetic_records(const SyntheticOptions& o) {
  RecordSet r;
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::normal_distribution<double> noise(0, 1);
  const char* classes[] = {"car", "person", "bike"};
  const int n_calib = static_cast<int>(o.frames * o.calib_fraction);
  for (int f = 0; f < o.frames; ++f) {
    const bool calib = f < n_calib;
    const double diff = std::clamp(u(rng) + (calib ? 0.0 : o.test_shift), 0.0, 1.0);
    const int objects = 1 + static_cast<int>(u(rng) * (2 + 8 * diff));
    int small = 0, weak_low = 0, weak_count = 0;
    for (int k = 0; k < objects; ++k) {
      const bool is_small = u(rng) < 0.2 + 0.6 * diff;
      const double occl = u(rng) * diff;
      small += is_small;
      const double side = is_small ? 8 + 8 * u(rng) : 30 + 60 * u(rng);
      const Box b{u(rng) * 600, u(rng) * 400, side, side * (0.6 + 0.8 * u(rng))};
      const std::string cls = classes[static_cast<int>(u(rng) * 3) % 3];
      r.gts.push_back({f, k, b, cls, false});
      const double p_weak = (is_small ? 0.35 : 0.9) * (1 - 0.6 * occl);
      const double p_strong = (is_small ? 0.85 : 0.97) * (1 - 0.2 * occl);
      if (u(rng) < p_weak) {
        Box d = b;
        d.left += (u(rng) - 0.5) * side * 0.2;
        const double conf = std::clamp(0.35 + 0.6 * u(rng) - 0.3 * occl, 0.05, 0.99);
        r.weak.push_back({f, -1, d, conf, cls, Source::kWeak});
        ++weak_count;
        weak_low += conf < 0.5;
      }
      if (u(rng) < p_strong) {
        Box d = b;
        d.left += (u(rng) - 0.5) * side * 0.05;
        r.strong.push_back(
            {f, -1, d, std::clamp(0.6 + 0.4 * u(rng), 0.0, 0.999), cls, Source::kStrong});
      }
    }
    for (int k = 0; k < static_cast<int>(u(rng) * 3 * (0.5 + diff)); ++k) {  // weak FPs
      r.weak.push_back({f, -1, Box{u(rng) * 600, u(rng) * 400, 20, 20}, 0.1 + 0.4 * u(rng),
                        classes[k % 3], Source::kWeak});
      ++weak_count;
      weak_low += 1;
    }
    if (u(rng) < 0.3) {  // occasional strong FP
      r.strong.push_back({f, -1, Box{u(rng) * 600, u(rng) * 400, 20, 20}, 0.3 * u(rng), classes[0],
                          Source::kStrong});
    }
    r.frames.push_back(f);
    r.split.push_back(calib ? "calib" : "test");
    // Pixel-level view: objects and small objects, noisy. Weak-detection view: low-confidence
    // share and how many objects the weak model reported, noisy.
    r.scores["skip"].push_back(0.15 * objects + 0.5 * small + 0.6 * noise(rng));
    r.scores["cond"].push_back(0.4 * weak_low + 0.2 * weak_count + 0.6 * noise(rng));
  }
  return r;
}

}  // namespace ferry::route
