// SPDX-License-Identifier: Apache-2.0
// Shared by the tests that read the Hugging Face model fixtures (tests/data/models/<arch>,
// made by tools/fixtures/): where a fixture lives, and a fixture tensor as f32.
#pragma once

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

}  // namespace ferry::testing
