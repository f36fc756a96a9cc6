// SPDX-License-Identifier: Apache-2.0
// The XGBoost tree walker against libxgboost's own predictions (the artifact's 100-tree booster,
// tests/data/route/cond_xgboost_moric.model.json from tools/route/extract_xgboost.py) and against
// a hand-written one-tree model.
#include "route/xgboost_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "route/features.h"
#include "route/xgboost_reference.h"

namespace ferry::route {
namespace {

const std::string kModel =
    std::string(FERRY_TEST_DATA_DIR) + "/route/cond_xgboost_moric.model.json";
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Feature rows: realistic frames through cond_features (seeded), the all-zero empty frame,
// extreme values, and rows with missing (NaN) features.
std::vector<float> feature_rows(int* n_rows) {
  std::vector<float> rows;
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  for (int r = 0; r < 40; ++r) {
    std::vector<Detection> dets(static_cast<std::size_t>(u(rng) * 30));
    for (auto& d : dets) {
      d.score = 0.05 + 0.95 * u(rng);
      d.box = {u(rng) * 400, u(rng) * 300, 5 + u(rng) * 300, 5 + u(rng) * 300};
    }
    auto f = cond_features(dets);
    EXPECT_TRUE(f.ok());
    for (double v : *f) rows.push_back(static_cast<float>(v));
  }
  for (int i = 0; i < kNumCondFeatures; ++i) rows.push_back(0.0f);
  for (int i = 0; i < kNumCondFeatures; ++i) rows.push_back(1e9f);
  for (int i = 0; i < kNumCondFeatures; ++i) rows.push_back(i % 3 == 0 ? kNaN : 0.5f * i);
  for (int i = 0; i < kNumCondFeatures; ++i) rows.push_back(kNaN);
  *n_rows = static_cast<int>(rows.size()) / kNumCondFeatures;
  return rows;
}

TEST(RouteXgboost, ArtifactModelMatchesLibxgboost) {
  auto model = XgbModel::load(kModel);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ(model->num_features(), 21);
  EXPECT_EQ(model->num_trees(), 100);
  EXPECT_EQ(model->objective(), "reg:squarederror");
  int n = 0;
  const std::vector<float> rows = feature_rows(&n);
  auto ref = xgboost_library_predict(kModel, rows, n, kNumCondFeatures);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  float lo = 1e9f, hi = -1e9f;
  for (int r = 0; r < n; ++r) {
    auto p = model->predict({rows.data() + r * kNumCondFeatures, kNumCondFeatures});
    ASSERT_TRUE(p.ok());
    EXPECT_NEAR(*p, (*ref)[static_cast<std::size_t>(r)], 1e-6) << "row " << r;
    lo = std::min(lo, *p);
    hi = std::max(hi, *p);
  }
  // The rows must exercise the model: not one constant prediction.
  EXPECT_GT(hi - lo, 0.05f);
}

// One tree: root splits feature 1 at 0.5 (missing goes left); left leaf 0.25, right leaf -0.5.
// base_score 0.5 (squared error: margin = base_score). So x1 = 0.4 -> 0.75, x1 = 0.5 -> 0.0
// (0.5 < 0.5 is false: right), NaN -> 0.75. Floats are written with a decimal point because
// libxgboost 1.7 rejects an integer where its schema wants a number.
constexpr const char* kTinyModel = R"({"learner":{
  "learner_model_param":{"base_score":"5E-1","num_class":"0","num_feature":"2","num_target":"1"},
  "objective":{"name":"reg:squarederror","reg_loss_param":{"scale_pos_weight":"1"}},
  "gradient_booster":{"name":"gbtree","model":{
    "gbtree_model_param":{"num_parallel_tree":"1","num_trees":"1"},"tree_info":[0],
    "trees":[{"id":0,"tree_param":{"num_deleted":"0","num_feature":"2","num_nodes":"3",
      "size_leaf_vector":"1"},
      "left_children":[1,-1,-1],"right_children":[2,-1,-1],"parents":[2147483647,0,0],
      "split_indices":[1,0,0],"split_conditions":[0.5,0.25,-0.5],"split_type":[0,0,0],
      "default_left":[1,0,0],"base_weights":[0.0,0.25,-0.5],"loss_changes":[1.0,0.0,0.0],
      "sum_hessian":[2.0,1.0,1.0],"categories":[],"categories_nodes":[],"categories_segments":[],
      "categories_sizes":[]}]}},
  "attributes":{},"feature_names":[],"feature_types":[]},"version":[1,7,4]})";

TEST(RouteXgboost, HandWrittenTree) {
  auto model = XgbModel::parse(kTinyModel, "tiny");
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const float rows[4][2] = {{9, 0.4f}, {9, 0.5f}, {9, kNaN}, {kNaN, 2}};
  const float expected[4] = {0.75f, 0.0f, 0.75f, 0.0f};
  for (int r = 0; r < 4; ++r) {
    auto p = model->predict(rows[r]);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, expected[r]) << r;
  }
  // libxgboost agrees on the same file.
  const auto path = std::filesystem::temp_directory_path() / "ferry_route_tiny_xgb.json";
  std::ofstream(path) << kTinyModel;
  auto ref = xgboost_library_predict(path.string(), {9, 0.4f, 9, 0.5f, 9, kNaN, kNaN, 2}, 4, 2);
  std::filesystem::remove(path);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (int r = 0; r < 4; ++r) EXPECT_EQ((*ref)[static_cast<std::size_t>(r)], expected[r]) << r;
}

TEST(RouteXgboost, BadInputIsAStatus) {
  auto model = XgbModel::parse(kTinyModel, "tiny");
  ASSERT_TRUE(model.ok());
  const float one[1] = {0};
  EXPECT_EQ(model->predict(one).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(XgbModel::load("/nonexistent/model.json").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(XgbModel::parse("{not json", "x").ok());
  EXPECT_EQ(XgbModel::parse("{}", "x").status().code(), StatusCode::kCorrupt);
  auto replace = [](std::string s, const std::string& from, const std::string& to) {
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  const std::string base = kTinyModel;
  // A child pointing backwards would loop forever: rejected at load.
  EXPECT_EQ(XgbModel::parse(replace(base, "\"left_children\":[1,", "\"left_children\":[0,"), "x")
                .status()
                .code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(XgbModel::parse(replace(base, "\"split_indices\":[1,", "\"split_indices\":[7,"), "x")
                .status()
                .code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(XgbModel::parse(replace(base, "\"split_type\":[0,", "\"split_type\":[1,"), "x")
                .status()
                .code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(
      XgbModel::parse(replace(base, "reg:squarederror", "multi:softprob"), "x").status().code(),
      StatusCode::kUnimplemented);
  EXPECT_EQ(XgbModel::parse(replace(base, "\"num_nodes\":\"3\"", "\"num_nodes\":\"4\""), "x")
                .status()
                .code(),
            StatusCode::kCorrupt);
  EXPECT_EQ(xgboost_library_predict("/nonexistent.json", {0, 0}, 1, 2).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace ferry::route
