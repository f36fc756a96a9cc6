// SPDX-License-Identifier: Apache-2.0
// A gradient-boosted tree ensemble read from XGBoost's JSON model schema (as written by
// tools/route/extract_xgboost.py or Booster.save_model("*.json")), evaluated by a plain tree walk.
// Supported: gbtree, single output (num_class 0, num_target 1), numerical splits, objectives whose
// output is the margin (reg:squarederror, reg:absoluteerror, reg:pseudohubererror) or its
// sigmoid (reg:logistic, binary:logistic). Anything else (dart, categorical splits, multi-class,
// vector leaves) is kUnimplemented at load time, never a wrong prediction.
//
// Prediction follows libxgboost's CPU predictor: features are cast to float, a node goes left iff
// x < split_condition, a NaN feature follows default_left, and leaf values are summed in float
// starting from the base margin, tree by tree. The slow twin is libxgboost itself
// (xgboost_reference.h); tests/unit/route/xgboost_model_test.cpp checks the two agree to 1e-6.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace ferry::route {

class XgbModel {
 public:
  static Result<XgbModel> load(const std::string& path);
  static Result<XgbModel> parse(std::string_view json_text, std::string_view what);

  int num_features() const { return num_features_; }
  int num_trees() const { return static_cast<int>(roots_.size()); }
  float base_score() const { return base_score_; }
  const std::string& objective() const { return objective_; }

  // x: [num_features()] (NaN = missing). kInvalidArgument on a size mismatch.
  Result<float> predict(std::span<const float> x) const;
  // Same without the size check (the caller guarantees x.size() == num_features()).
  float predict_unchecked(const float* x) const;

 private:
  // All trees' nodes in one array; children are absolute indices, left < 0 marks a leaf whose
  // value is in `value`.
  struct Node {
    std::int32_t left = -1, right = -1;
    std::int32_t feature = 0;
    float value = 0;  // split condition, or leaf value
    bool default_left = false;
  };
  std::vector<Node> nodes_;
  std::vector<std::int32_t> roots_;
  int num_features_ = 0;
  float base_score_ = 0;  // margin space
  bool sigmoid_ = false;
  std::string objective_;
};

}  // namespace ferry::route
