// SPDX-License-Identifier: Apache-2.0
// Curves the MV-WSA allocator trades against each other, all "expected cost per step as a
// function of how many units (expert slots of one layer, or KV blocks) a pool gets":
//   - lower_convex_hull(): the convexified curve (Andrew's monotone chain over (x, y[x])). On a
//     convex curve the marginal saving of one more unit never rises, so greedy allocation by
//     saving per byte is optimal for the convexified problem (serve.md MV-WSA);
//   - kv_shortage_curve(): E[max(0, demand - k)] over observed per-step block demands, the KV
//     blocks missing per step at capacity k. It is convex by construction (a mean of hinges).
// Tests: tests/unit/serve/wsa_allocator_test.cpp.
#pragma once

#include <span>
#include <vector>

namespace ferry::serve::wsa {

// Indices of the lower hull's vertices over x = 0..n-1, ascending; always holds 0 and n-1.
std::vector<int> lower_convex_hull(std::span<const double> y);
// The hull evaluated at every x (linear between vertices): y_hull[x] <= y[x], equality at vertices.
std::vector<double> convexify(std::span<const double> y);
// [max_blocks + 1]: the mean over samples of max(0, demand - k), for k = 0..max_blocks.
std::vector<double> kv_shortage_curve(std::span<const double> demand_samples, int max_blocks);

}  // namespace ferry::serve::wsa
