// SPDX-License-Identifier: Apache-2.0
// The tolerance rule of the convolution kernel tests (style.md): the kernel's largest error
// against a double-precision loop is at most twice a naive float loop's (+1e-6 for exact zeros),
// every output is finite, and the guard value after the output is untouched.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace ferry::route::testing {

// out: the kernel's output with one guard float (12345) after it; want: f64 loop; twin: f32 loop.
inline void expect_within_twice_naive(const std::vector<float>& out,
                                      const std::vector<double>& want,
                                      const std::vector<float>& twin, const std::string& what) {
  double err = 0, err_naive = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << "i=" << i << " " << what;
    err = std::max(err, std::abs(out[i] - want[i]));
    err_naive = std::max(err_naive, std::abs(twin[i] - want[i]));
  }
  EXPECT_EQ(out.back(), 12345.0f) << "wrote past the output: " << what;
  EXPECT_LE(err, 2 * err_naive + 1e-6) << what;
}

}  // namespace ferry::route::testing
