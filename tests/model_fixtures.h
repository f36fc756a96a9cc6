// SPDX-License-Identifier: Apache-2.0
// Shared by the tests that read the Hugging Face model fixtures (tests/data/models/<arch>,
// made by tools/fixtures/): where a fixture lives, a fixture tensor as f32, and the two error
// metrics the whole-model comparisons use.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "tensor/tensor_view.h"

namespace ferry::testing {

inline std::string model_fixture_dir(const std::string& arch) {
  return std::string(FERRY_TEST_DATA_DIR) + "/models/" + arch;
}

inline std::vector<float> fixture_to_f32(const ConstTensorView& v) {
  std::vector<float> out(static_cast<std::size_t>(v.numel()));
  EXPECT_TRUE(convert_elements(v.data, v.dtype, out.data(), DType::kF32, out.size()));
  return out;
}

// ||a - b|| / ||b|| over all elements (||a - b|| when b is all zeros): gradients.
inline double rel_norm_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// max |a - b| / max |b|: logits.
inline double rel_max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double mx = 0, err = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    mx = std::max(mx, std::fabs(double(b[i])));
    err = std::max(err, std::fabs(double(a[i]) - b[i]));
  }
  return err / mx;
}

}  // namespace ferry::testing
