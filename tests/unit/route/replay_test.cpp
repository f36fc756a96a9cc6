// SPDX-License-Identifier: Apache-2.0
// tune/eval on synthetic records: the router depends on calibration frames only; the feedback
// controller realises every grid ρ within ±0.01 on a shifted test split; end points equal the
// weak-only / strong-only APs; CSV columns are artifact-compatible; records round-trip.
#include "route/replay.h"

#include <cmath>
#include <cstdlib>

#include <gtest/gtest.h>

#include "route/ap.h"
#include "route/synthetic.h"

namespace ferry::route {
namespace {

RecordSet records(double shift) {
  SyntheticOptions o;
  o.frames = 1200;
  o.test_shift = shift;
  o.seed = 3;
  return make_synthetic_records(o);
}

TEST(RouteReplay, RouterIsTunedOnCalibrationOnly) {
  RecordSet a = records(0.0), b = records(0.4);  // same calib frames, different test frames
  ReplayOptions o;
  auto ta = tune_router(a.subset("calib"), "skip", "cond", o, 0);
  auto tb = tune_router(b.subset("calib"), "skip", "cond", o, 0);
  ASSERT_TRUE(ta.ok() && tb.ok()) << ta.status().to_string();
  EXPECT_EQ(ta->router.table.table(), tb->router.table.table());
  EXPECT_EQ(ta->router.skip_calibration, tb->router.skip_calibration);
  EXPECT_EQ(ta->router.skip_calibration.size(), 600u);
  auto back = TunedRouter::from_json(ta->router.to_json());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->table.table(), ta->router.table.table());
  EXPECT_FALSE(
      TunedRouter::from_json(Json::parse(R"({"grid":[0,1],"placement":["x","skip"]})")).ok());
}

TEST(RouteReplay, FeedbackHoldsBudgetOnShiftedTestAndEndpointsMatch) {
  const RecordSet all = records(0.3);
  const RecordSet calib = all.subset("calib"), test = all.subset("test");
  ReplayOptions o;
  auto rows = replay_placement(test, "skip", Placement::kSkip, "skip", calib.scores.at("skip"), o);
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  // Auto gain η = 1/(0.01·600 − 1) = 0.2: bound (1/η + 1)/600 = 6/600 = 0.01 (controller.h).
  for (const auto& r : *rows)
    EXPECT_LE(std::fabs(r.realised - r.ratio), 0.01 + 1e-12) << r.ratio;  // 1e-12: /600 rounding
  // ρ = 0 is weak-only, ρ = 1 strong-only (ranks per model over the split).
  auto w = evaluate_ap(test.gts, test.weak, ApMetric::kPooled11, ApOptions{});
  auto s = evaluate_ap(test.gts, test.strong, ApMetric::kPooled11, ApOptions{});
  ASSERT_TRUE(w.ok() && s.ok());
  EXPECT_EQ(rows->front().map, w->mean);
  EXPECT_EQ(rows->back().map, s->mean);
  EXPECT_GT(s->mean, w->mean);
  // The paper's fixed threshold drifts on the shifted split.
  o.controller = ControllerKind::kPaper;
  auto paper = replay_placement(test, "skip", Placement::kSkip, "skip", calib.scores.at("skip"), o);
  ASSERT_TRUE(paper.ok());
  double worst = 0;
  for (const auto& r : *paper) worst = std::max(worst, std::fabs(r.realised - r.ratio));
  EXPECT_GT(worst, 0.02);
  const std::string csv = replay_rows_to_csv(*rows);
  EXPECT_EQ(csv.rfind("estimator,ratio,mAP,mAP_coco,mAP_coco50,", 0), 0u);
}

TEST(RouteReplay, RecordsRoundTripAndRejectUnknownFrames) {
  RecordSet r = records(0.0).subset("test");
  const std::string dir = ::testing::TempDir() + "/route_records";
  ASSERT_TRUE(save_records(r, dir).ok());
  auto back = load_records(dir);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->frames, r.frames);
  EXPECT_EQ(back->gts.size(), r.gts.size());
  EXPECT_EQ(back->weak.size(), r.weak.size());
  r.weak.push_back({999999, -1, Box{0, 0, 1, 1}, 0.5, "car", Source::kWeak});
  ASSERT_TRUE(save_records(r, dir).ok());
  EXPECT_EQ(load_records(dir).status().code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace ferry::route
