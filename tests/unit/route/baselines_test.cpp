// SPDX-License-Identifier: Apache-2.0
// EdgeML MLP against PyTorch's outputs of the artifact checkpoint (edgeml_parity.json, written by
// tools/route/export_skip_estimator.py), and the DCSB rule on hand-computed frames.
#include "route/baselines.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "core/file_util.h"
#include "core/json.h"
#include "route/features.h"

namespace ferry::route {
namespace {

const std::string kEdgeMl = std::string(FERRY_TEST_DATA_DIR) + "/route/edgeml_parity.json";

TEST(RouteBaselines, EdgeMlMatchesPyTorch) {
  auto model = EdgeMlModel::load(kEdgeMl);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ(model->input_dim(), 150);
  auto text = read_file(kEdgeMl);
  ASSERT_TRUE(text.ok());
  auto doc = parse_json(*text, "edgeml_parity.json");
  ASSERT_TRUE(doc.ok());
  const auto rows = (*doc)["rows"].get<std::vector<std::vector<double>>>();
  const auto expected = (*doc)["torch_fp32"].get<std::vector<double>>();
  ASSERT_EQ(rows.size(), expected.size());
  ASSERT_GE(rows.size(), 5u);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::vector<float> x(rows[r].begin(), rows[r].end());
    auto p = model->predict(x);
    ASSERT_TRUE(p.ok());
    // PyTorch ran in float32 (inputs standardised in float64 then cast); 1e-5 covers that.
    EXPECT_NEAR(*p, expected[r], 1e-5) << "row " << r;
  }
  EXPECT_TRUE(EdgeMlModel::offload(0.95, 0.1));   // 0.95 > 0.9
  EXPECT_FALSE(EdgeMlModel::offload(0.85, 0.1));  // 0.85 <= 0.9
}

TEST(RouteBaselines, EdgeMlOnProposals) {
  auto model = EdgeMlModel::load(kEdgeMl);
  ASSERT_TRUE(model.ok());
  Detection d;
  d.score = 0.9;
  d.box = {10, 10, 100, 80};
  auto x = edgeml_proposals({d}, 500, 375);
  ASSERT_TRUE(x.ok());
  auto p = model->predict(*x);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(std::isfinite(*p));
}

TEST(RouteBaselines, EdgeMlBadInput) {
  auto model = EdgeMlModel::load(kEdgeMl);
  ASSERT_TRUE(model.ok());
  std::vector<float> short_row(10, 0.0f);
  EXPECT_EQ(model->predict(short_row).status().code(), StatusCode::kInvalidArgument);
  std::vector<float> nan_row(150, 0.0f);
  nan_row[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(model->predict(nan_row).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EdgeMlModel::load("/nonexistent.json").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(EdgeMlModel::parse("{}", "x").status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(EdgeMlModel::parse(R"({"state":{},"shapes":{}})", "x").status().code(),
            StatusCode::kCorrupt);
}

Detection box(double score, double w, double h) {
  Detection d;
  d.score = score;
  d.box = {0, 0, w, h};
  return d;
}

// Image 100x100 (area 10^4); default (artifact) parameters: confidence >= 0.07808, count >= 3,
// area < 0.0066546, count_scale 17.882546, area_scale 0.187519.
TEST(RouteBaselines, DcsbHandCases) {
  const double cs = 17.88254647143457, as = 0.1875190791383996;
  // No proposal: n = 0, a = 1 -> easy, score 0 + 0 + 0.5·(1 − min(1/as, 1)) = 0.
  auto empty = dcsb_score({}, 100, 100);
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->difficult);
  EXPECT_DOUBLE_EQ(empty->score, 0.0);
  // Two kept proposals 50x50 (0.25) and 30x30 (0.09), one below the confidence threshold
  // (ignored although tiny): n = 2 < 3, a = 0.09 >= 0.00665 -> easy,
  // score = 0.5·2/cs + 0.5·(1 − 0.09/as).
  auto easy = dcsb_score({box(0.5, 50, 50), box(0.6, 30, 30), box(0.05, 1, 1)}, 100, 100);
  ASSERT_TRUE(easy.ok());
  EXPECT_FALSE(easy->difficult);
  EXPECT_NEAR(easy->score, 0.5 * 2 / cs + 0.5 * (1 - 0.09 / as), 1e-12);
  // One 5x5 proposal: a = 0.0025 < 0.00665 -> difficult (small object),
  // score = 1 + 0.5/cs + 0.5·(1 − 0.0025/as).
  auto small = dcsb_score({box(0.9, 5, 5)}, 100, 100);
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(small->difficult);
  EXPECT_NEAR(small->score, 1 + 0.5 / cs + 0.5 * (1 - 0.0025 / as), 1e-12);
  // Three large proposals: n = 3 >= 3 -> difficult (crowded), a = 0.25 >= as -> area part 0.
  auto crowd = dcsb_score({box(0.9, 50, 50), box(0.9, 50, 50), box(0.9, 50, 50)}, 100, 100);
  ASSERT_TRUE(crowd.ok());
  EXPECT_TRUE(crowd->difficult);
  EXPECT_NEAR(crowd->score, 1 + 0.5 * 3 / cs, 1e-12);
  EXPECT_GT(crowd->score, easy->score);  // every difficult frame outranks every easy one
  // Bad input.
  EXPECT_EQ(dcsb_score({}, 0, 100).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dcsb_score({box(0.5, -1, 3)}, 100, 100).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::route
