// SPDX-License-Identifier: Apache-2.0
// Target transforms: ECDF mid-ranks by hand, MORIC+ sign preservation, OffloadBin against the
// artifact's own target_distributions.csv, and per-frame gains by hand.
#include "route/targets.h"

#include <gtest/gtest.h>

#include "route/csv.h"
#include "route_test_util.h"

namespace ferry::route {
namespace {

TEST(RouteTargets, EcdfMidRanks) {
  const Ecdf e({1, 2, 2, 3});
  EXPECT_DOUBLE_EQ(e(2), (1 + 3) / 8.0);  // #<2 = 1, #<=2 = 3
  EXPECT_DOUBLE_EQ(e(0), 0.0);
  EXPECT_DOUBLE_EQ(e(5), 1.0);
  EXPECT_DOUBLE_EQ(e(2.5), (3 + 3) / 8.0);
}

TEST(RouteTargets, MoricPlusIsSignPreservingAndMonotone) {
  const std::vector<double> train = {-4, -1, 0, 0, 2, 6, 8};
  const MoricPlusTransform t(train);
  EXPECT_DOUBLE_EQ(t(0), 0.0);
  // (#< + #<= + 1) / (2n + 1): positives {2,6,8}: #<6 = 1, #<=6 = 2 -> 4/7.
  EXPECT_DOUBLE_EQ(t(6), (1 + 2 + 1) / 7.0);
  // magnitudes {1,4}: #<1 = 0, #<=1 = 1 -> -(2/5).
  EXPECT_DOUBLE_EQ(t(-1), -(0 + 1 + 1) / 5.0);
  EXPECT_DOUBLE_EQ(t(0.5), 1.0 / 7.0);  // below every positive: still positive
  EXPECT_DOUBLE_EQ(t(100), 1.0);
  double prev = -2;
  for (double x = -10; x <= 10; x += 0.25) {
    const double v = t(x);
    EXPECT_GE(v, prev);
    EXPECT_LE(std::fabs(v), 1.0);
    EXPECT_EQ(v > 0, x > 0);
    prev = v;
  }
  const MoricTransform m(train);
  EXPECT_DOUBLE_EQ(m(0), (2 + 4) / 14.0);
}

TEST(RouteTargets, OffloadBinMatchesArtifactLabels) {
  const std::string path =
      testing::shared_dir() + "/data/bgt-ada/paper-data/target_distributions.csv";
  auto t = CsvTable::load(path);
  ASSERT_TRUE(t.ok()) << "artifact data missing (shared/ must sit beside the clone): "
                      << t.status().to_string();
  ASSERT_EQ(t->rows(), 3105u);
  int positives = 0;
  for (std::size_t r = 0; r < t->rows(); ++r) {
    auto d = t->number(r, "delta_ap");
    auto b = t->number(r, "offload_bin");
    ASSERT_TRUE(d.ok() && b.ok());
    ASSERT_EQ(offload_bin(*d), *b) << "row " << r;
    positives += *b > 0;
  }
  EXPECT_GT(positives, 0);
}

TEST(RouteTargets, FrameGainByHand) {
  // Two objects; weak finds one (and one FP), strong finds both.
  const std::vector<GroundTruth> g = {{0, 1, Box{0, 0, 10, 10}, "a", false},
                                      {0, 2, Box{20, 0, 10, 10}, "a", false}};
  const std::vector<Detection> w = {{0, -1, Box{0, 0, 10, 10}, .9, "a", Source::kWeak},
                                    {0, -1, Box{50, 50, 10, 10}, .8, "a", Source::kWeak},
                                    {0, -1, Box{20, 0, 10, 10}, .2, "a", Source::kWeak}};
  const std::vector<Detection> s = {{0, -1, Box{0, 0, 10, 10}, .9, "a", Source::kStrong},
                                    {0, -1, Box{20, 0, 10, 10}, .7, "a", Source::kStrong}};
  const FrameGain fg = frame_gain(g, w, s, 0.5, MatchOptions{});
  EXPECT_EQ(fg.count_gain(), 1);
  // weak (conf >= .5): TP 1, FP 1, FN 1 -> F1 = 2/(2+1+1) = .5; strong: 1.
  EXPECT_DOUBLE_EQ(fg.f1_weak, 0.5);
  EXPECT_DOUBLE_EQ(fg.f1_gain(), 0.5);
}

}  // namespace
}  // namespace ferry::route
