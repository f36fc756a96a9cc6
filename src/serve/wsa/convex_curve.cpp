// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/convex_curve.h"

#include <algorithm>
#include <functional>

namespace ferry::serve::wsa {

std::vector<int> lower_convex_hull(std::span<const double> y) {
  std::vector<int> h;
  const int n = static_cast<int>(y.size());
  for (int x = 0; x < n; ++x) {
    // Pop the last vertex while it lies on or above the chord from its predecessor to x.
    while (h.size() >= 2) {
      const int a = h[h.size() - 2], b = h.back();
      const double cross = (double(b - a) * (y[std::size_t(x)] - y[std::size_t(a)])) -
                           (double(x - a) * (y[std::size_t(b)] - y[std::size_t(a)]));
      if (cross > 0) break;  // b strictly below the chord: keep it
      h.pop_back();
    }
    h.push_back(x);
  }
  return h;
}

std::vector<double> convexify(std::span<const double> y) {
  std::vector<double> out(y.size());
  if (y.empty()) return out;
  const std::vector<int> h = lower_convex_hull(y);
  for (std::size_t i = 0; i + 1 < h.size(); ++i) {
    const int a = h[i], b = h[i + 1];
    for (int x = a; x < b; ++x) {
      const double t = double(x - a) / double(b - a);
      out[std::size_t(x)] = y[std::size_t(a)] + t * (y[std::size_t(b)] - y[std::size_t(a)]);
    }
  }
  // Vertices exactly (the interpolation above would round at the segment's far end).
  for (int v : h) out[std::size_t(v)] = y[std::size_t(v)];
  return out;
}

std::vector<double> kv_shortage_curve(std::span<const double> demand_samples, int max_blocks) {
  std::vector<double> out(std::size_t(std::max(max_blocks, 0)) + 1, 0.0);
  if (demand_samples.empty()) return out;
  // Sweep k downwards over the samples sorted descending: with N samples above k summing to S,
  // sum_d max(0, d - k) = S - N k. O(n log n + max_blocks), called at every live decision.
  std::vector<double> d(demand_samples.begin(), demand_samples.end());
  std::sort(d.begin(), d.end(), std::greater<>());
  double sum = 0, n = 0;
  std::size_t i = 0;
  for (int k = max_blocks; k >= 0; --k) {
    while (i < d.size() && d[i] > double(k)) sum += d[i++], n += 1;
    out[std::size_t(k)] = (sum - n * double(k)) / double(d.size());
  }
  return out;
}

}  // namespace ferry::serve::wsa
