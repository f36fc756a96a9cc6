// SPDX-License-Identifier: Apache-2.0
// The 21 conditioned-estimator features and the EdgeML proposal vector on hand-computed frames.
#include "route/features.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace ferry::route {
namespace {

Detection det(double score, double l, double t, double w, double h) {
  Detection d;
  d.score = score;
  d.box = {l, t, w, h};
  return d;
}

// Three kept detections and one below the 0.3 threshold (ignored):
//   conf 0.4, box (0,0,10,20):  area 200,  centre (5,10),  aspect 0.5
//   conf 0.6, box (10,10,20,10): area 200, centre (20,15), aspect 2
//   conf 0.8, box (20,0,40,40): area 1600, centre (40,20), aspect 1
// conf: mean 0.6, population std 0.2·sqrt(2/3) = 0.1632993, median 0.6, q25 = 0.4 + 0.5·0.2 = 0.5
//   (position 0.25·2 = 0.5), q75 = 0.7.
// area = 200·(1,1,8): mean 2000/3, std 200·sqrt(98)/3 = 659.9663, total 2000, CV sqrt(98)/10.
// cx: mean 65/3, std sqrt(616.667/3) = 14.337209; cy: mean 15, std sqrt(50/3) = 4.0824829.
// aspect: mean 3.5/3, std sqrt(1.166667/3) = 0.6236096.
// corr(conf, area): cov = 0.2·200·7/3 = 280/3, stds' product 560/(3·sqrt 3) -> sqrt(3)/2.
TEST(RouteFeatures, HandComputedFrame) {
  const std::vector<Detection> dets = {det(0.4, 0, 0, 10, 20), det(0.2, 0, 0, 300, 300),
                                       det(0.8, 20, 0, 40, 40), det(0.6, 10, 10, 20, 10)};
  auto f = cond_features(dets);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const double expected[kNumCondFeatures] = {3,
                                             0.6,
                                             0.2 * std::sqrt(2.0 / 3.0),
                                             0.4,
                                             0.8,
                                             0.6,
                                             0.5,
                                             0.7,
                                             2000.0 / 3.0,
                                             200.0 * std::sqrt(98.0) / 3.0,
                                             200,
                                             1600,
                                             2000,
                                             65.0 / 3.0,
                                             std::sqrt((616.0 + 2.0 / 3.0) / 3.0),
                                             15,
                                             std::sqrt(50.0 / 3.0),
                                             3.5 / 3.0,
                                             std::sqrt((3.5 / 3.0) / 3.0),
                                             std::sqrt(98.0) / 10.0,
                                             std::sqrt(3.0) / 2.0};
  for (int i = 0; i < kNumCondFeatures; ++i) {
    EXPECT_NEAR((*f)[i], expected[i], 1e-9 * std::max(1.0, std::abs(expected[i])))
        << cond_feature_names()[i];
  }
}

// One kept detection: every spread is 0, correlation and CV are 0 by definition, all
// quantiles equal the one confidence. Confidence exactly 0.3 is kept (>=).
TEST(RouteFeatures, SingleDetectionAndThresholdBoundary) {
  auto f = cond_features({det(0.3, 10, 20, 30, 0)});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)[0], 1);
  for (int i : {1, 3, 4, 5, 6, 7}) EXPECT_DOUBLE_EQ((*f)[i], 0.3) << i;
  for (int i : {2, 9, 14, 16, 18, 19, 20}) EXPECT_EQ((*f)[i], 0) << i;
  EXPECT_EQ((*f)[8], 0);    // zero-height box: area 0
  EXPECT_EQ((*f)[13], 25);  // centre x = 10 + 30/2
  EXPECT_EQ((*f)[15], 20);
  EXPECT_EQ((*f)[17], 0);  // aspect of a zero-height box is 0, not inf
}

TEST(RouteFeatures, EmptyFrameIsAllZeros) {
  for (const auto& dets :
       {std::vector<Detection>{}, std::vector<Detection>{det(0.29, 0, 0, 5, 5)}}) {
    auto f = cond_features(dets);
    ASSERT_TRUE(f.ok());
    for (double v : *f) EXPECT_EQ(v, 0);
  }
}

TEST(RouteFeatures, OrderDoesNotMatter) {
  const std::vector<Detection> a = {det(0.9, 1, 2, 3, 4), det(0.5, 10, 2, 30, 4),
                                    det(0.7, 5, 5, 5, 50)};
  const std::vector<Detection> b = {a[2], a[0], a[1]};
  auto fa = cond_features(a), fb = cond_features(b);
  ASSERT_TRUE(fa.ok() && fb.ok());
  for (int i = 0; i < kNumCondFeatures; ++i) EXPECT_NEAR((*fa)[i], (*fb)[i], 1e-12) << i;
}

TEST(RouteFeatures, BadInputIsAStatus) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(cond_features({det(nan, 0, 0, 1, 1)}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cond_features({det(0.5, 0, 0, -1, 1)}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      cond_features({det(0.5, 0, std::numeric_limits<double>::infinity(), 1, 1)}).status().code(),
      StatusCode::kInvalidArgument);
}

// Image 100x50. conf 0.9 box (0,0,100,50) -> [0.9, 0.5, 0.5, 1, 1, 1];
// conf 0.5 box (10,10,20,10) -> centre (20,15) -> [0.5, 0.2, 0.3, 0.2, 0.2, 0.04]; rest zeros.
TEST(RouteFeatures, EdgeMlProposalsHandCase) {
  auto v = edgeml_proposals({det(0.5, 10, 10, 20, 10), det(0.9, 0, 0, 100, 50)}, 100, 50);
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->size(), 150u);
  const float expected[12] = {0.9f, 0.5f, 0.5f, 1, 1, 1, 0.5f, 0.2f, 0.3f, 0.2f, 0.2f, 0.04f};
  for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ((*v)[i], expected[i]) << i;
  for (std::size_t i = 12; i < v->size(); ++i) EXPECT_EQ((*v)[i], 0) << i;
}

TEST(RouteFeatures, EdgeMlKeepsTopK) {
  std::vector<Detection> dets;
  for (int i = 0; i < 30; ++i) dets.push_back(det(0.01 * i, i, 0, 1, 1));
  auto v = edgeml_proposals(dets, 100, 100);
  ASSERT_TRUE(v.ok());
  // Highest confidence first: 0.29, 0.28, ..., 0.05 (the 25th); 0.04 .. 0.00 are dropped.
  EXPECT_FLOAT_EQ((*v)[0], 0.29f);
  EXPECT_FLOAT_EQ((*v)[24 * 6], 0.05f);
  EXPECT_EQ(edgeml_proposals(dets, 0, 100).status().code(), StatusCode::kInvalidArgument);
}

TEST(RouteFeatures, QuantileMatchesNumpyLinear) {
  // numpy.percentile([1, 2, 4, 8], 25) = 1 + 0.75·(2 − 1) = 1.75 (position 0.25·3 = 0.75).
  EXPECT_DOUBLE_EQ(sorted_quantile({1, 2, 4, 8}, 0.25), 1.75);
  EXPECT_DOUBLE_EQ(sorted_quantile({1, 2, 4, 8}, 0.5), 3.0);
  EXPECT_DOUBLE_EQ(sorted_quantile({1, 2, 4, 8}, 1.0), 8.0);
}

}  // namespace
}  // namespace ferry::route
