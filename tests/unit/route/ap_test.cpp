// SPDX-License-Identifier: Apache-2.0
// AP metrics against hand-computed cases: ties, duplicates, empty frames, class mismatch,
// 11-point vs all-point vs 101-point, COCO threshold sweep, pooled rank normalisation, parsing.
#include "route/ap.h"

#include <gtest/gtest.h>

namespace ferry::route {
namespace {

GroundTruth gt(int frame, double x, double y, std::string cls = "a", bool difficult = false) {
  return GroundTruth{frame, -1, Box{x, y, 10, 10}, std::move(cls), difficult};
}
Detection det(int frame, double x, double y, double score, std::string cls = "a",
              Source src = Source::kWeak) {
  return Detection{frame, -1, Box{x, y, 10, 10}, score, std::move(cls), src};
}
double ap(const std::vector<GroundTruth>& g, const std::vector<Detection>& d, ApMetric m,
          const ClassMap* cmap = nullptr) {
  ApOptions o;
  o.class_map = cmap;
  auto r = evaluate_ap(g, d, m, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->mean : -1;
}

TEST(RouteIou, OverlapAndDisjoint) {
  // (0,0,10,10) vs (5,0,10,10): intersection 5*10 = 50, union 100+100-50 = 150.
  EXPECT_DOUBLE_EQ(iou(Box{0, 0, 10, 10}, Box{5, 0, 10, 10}), 50.0 / 150.0);
  EXPECT_DOUBLE_EQ(iou(Box{0, 0, 10, 10}, Box{20, 0, 10, 10}), 0.0);
  EXPECT_DOUBLE_EQ(iou(Box{0, 0, 0, 0}, Box{0, 0, 0, 0}), 0.0);
}

// Two objects; ranked list TP(.9), FP(.8), TP(.7): PR points (R .5, P 1), (.5, .5), (1, 2/3).
const std::vector<GroundTruth> kTwo = {gt(0, 0, 0), gt(0, 20, 0)};
const std::vector<Detection> kTpFpTp = {det(0, 0, 0, .9), det(0, 50, 50, .8), det(0, 20, 0, .7)};

TEST(RouteAp, ElevenPointVersusAllPoint) {
  // VOC07: t in {0,...,.5} (6 points) -> max P at R>=t = 1; t in {.6,...,1} (5) -> 2/3.
  // (6 + 5*2/3) / 11 = 28/33.
  EXPECT_DOUBLE_EQ(ap(kTwo, kTpFpTp, ApMetric::kVoc07), 28.0 / 33.0);
  // VOC12: envelope 1 over recall [0,.5], 2/3 over (.5,1]: .5*1 + .5*2/3 = 5/6.
  EXPECT_DOUBLE_EQ(ap(kTwo, kTpFpTp, ApMetric::kVoc12), 5.0 / 6.0);
  // COCO 101-point at .5: rt in {0,...,.50} (51) -> 1, rt in {.51,...,1} (50) -> 2/3.
  // (51 + 50*2/3)/101 = 253/303. Boxes match exactly, so every IoU threshold gives the same.
  EXPECT_NEAR(ap(kTwo, kTpFpTp, ApMetric::kCoco50), 253.0 / 303.0, 1e-15);
  EXPECT_NEAR(ap(kTwo, kTpFpTp, ApMetric::kCoco), 253.0 / 303.0, 1e-15);
}

TEST(RouteAp, TiesFormOneThresholdStepWhateverTheInputOrder) {
  // TP(.9), then FP and TP tied at .5: the tie is one step, PR points (.5, 1), (1, 2/3).
  // Without grouping the answer would depend on order (5/6 or 1).
  const std::vector<Detection> a = {det(0, 0, 0, .9), det(0, 50, 50, .5), det(0, 20, 0, .5)};
  const std::vector<Detection> b = {det(0, 20, 0, .5), det(0, 50, 50, .5), det(0, 0, 0, .9)};
  EXPECT_DOUBLE_EQ(ap(kTwo, a, ApMetric::kVoc12), 5.0 / 6.0);
  EXPECT_DOUBLE_EQ(ap(kTwo, b, ApMetric::kVoc12), 5.0 / 6.0);
  EXPECT_DOUBLE_EQ(ap(kTwo, a, ApMetric::kVoc07), 28.0 / 33.0);
  EXPECT_DOUBLE_EQ(ap(kTwo, b, ApMetric::kVoc07), 28.0 / 33.0);
}

TEST(RouteAp, DuplicateOnMatchedObjectIsFalsePositive) {
  // One object, two detections on it: TP(.9) then FP(.8). PR (1,1),(1,.5): AP 1 in both.
  const std::vector<GroundTruth> g = {gt(0, 0, 0)};
  const std::vector<Detection> d = {det(0, 0, 0, .8), det(0, 0, 0, .9)};
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kVoc07), 1.0);
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kVoc12), 1.0);
  // A duplicate ranked above a second object's TP lowers precision there:
  // TP(.9) obj1, FP(.8) dup of obj1, TP(.7) obj2 == the kTpFpTp case.
  const std::vector<Detection> d2 = {det(0, 0, 0, .9), det(0, 1, 0, .8), det(0, 20, 0, .7)};
  EXPECT_DOUBLE_EQ(ap(kTwo, d2, ApMetric::kVoc12), 5.0 / 6.0);
}

TEST(RouteAp, EmptyFramesCountInRecallAndPrecision) {
  // Frame 0: object found (.9). Frame 1: object, no detection. npos = 2, PR (.5, 1).
  const std::vector<GroundTruth> g = {gt(0, 0, 0), gt(1, 0, 0)};
  std::vector<Detection> d = {det(0, 0, 0, .9)};
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kVoc07), 6.0 / 11.0);  // t = 0..0.5 -> 1
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kVoc12), 0.5);
  // Frame 2 has no objects; its detection (.95) is a FP ranked first: PR (0,0), (.5,.5).
  d.push_back(det(2, 0, 0, .95));
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kVoc12), 0.25);
  // No detections at all: AP 0.
  EXPECT_DOUBLE_EQ(ap(g, {}, ApMetric::kVoc12), 0.0);
}

TEST(RouteAp, ClassMismatchNeedsTheMap) {
  const std::vector<GroundTruth> g = {gt(0, 0, 0, "motorbike")};
  const std::vector<Detection> d = {det(0, 0, 0, .9, "motorcycle")};
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kVoc07), 0.0);
  auto m = ClassMap::parse("# coco -> voc\nmotorcycle=motorbike\n", "map");
  ASSERT_TRUE(m.ok());
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kVoc07, &*m), 1.0);
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kPooled11, &*m), 1.0);
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kPooled11), 0.0);
}

TEST(RouteAp, DifficultObjectsAreIgnored) {
  // A detection on a difficult object is neither TP nor FP; the object is not in npos.
  const std::vector<GroundTruth> g = {gt(0, 0, 0), gt(0, 20, 0, "a", true)};
  const std::vector<Detection> d = {det(0, 20, 0, .95), det(0, 0, 0, .9)};
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kVoc12), 1.0);
}

TEST(RouteAp, CocoSweepsIouThresholds) {
  // Detection (0,0,10,7.2) on object (0,0,10,10): IoU = 72/100 = .72 -> TP at .50,...,.70 (5 of
  // 10 thresholds, AP 1 each), FP at .75,...,.95 (AP 0): mean .5.
  const std::vector<GroundTruth> g = {gt(0, 0, 0)};
  const std::vector<Detection> d = {Detection{0, -1, Box{0, 0, 10, 7.2}, .9, "a", Source::kWeak}};
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kCoco), 0.5);
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kCoco50), 1.0);
}

TEST(RouteAp, PooledIsOneCurveNotAClassMean) {
  // Class a: TP(.9). Class b: FP(.8), TP(.7). Pooled list TP,FP,TP over npos 2 -> 28/33.
  // Per class VOC07: a = 1; b: PR (0,0),(1,.5) -> .5 at every t -> .5; mean .75.
  const std::vector<GroundTruth> g = {gt(0, 0, 0, "a"), gt(0, 20, 0, "b")};
  const std::vector<Detection> d = {det(0, 0, 0, .9, "a"), det(0, 50, 50, .8, "b"),
                                    det(0, 20, 0, .7, "b")};
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kPooled11), 28.0 / 33.0);
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kVoc07), 0.75);
}

TEST(RouteAp, PooledRankNormalisesPerModel) {
  // Weak scores {.9 (FP), .1 (TP obj1)}: mid-ranks .75, .25. Strong {.5 (TP obj2), .4 (FP)}:
  // .75, .25. Ranked groups: {.75: FP, TP} -> (R .5, P .5); {.25: TP, FP} -> (R 1, P .5).
  // 11-point: .5 everywhere = .5. Raw scores would rank .9 FP, .5 TP, .4 FP, .1 TP:
  // points (0,0),(.5,.5),(.5,1/3),(1,.5) -> envelope .5 -> also .5; so check the ranks directly.
  const std::vector<double> s = {.9, .1};
  const auto r = rank_normalize(s);
  EXPECT_DOUBLE_EQ(r[0], .75);
  EXPECT_DOUBLE_EQ(r[1], .25);
  const std::vector<double> tied = {.3, .3, .7};
  const auto rt = rank_normalize(tied);  // #< .3 = 0, #<= .3 = 2 -> 2/6; .7: (2+3)/6
  EXPECT_DOUBLE_EQ(rt[0], 2.0 / 6.0);
  EXPECT_DOUBLE_EQ(rt[2], 5.0 / 6.0);
  const std::vector<GroundTruth> g = {gt(0, 0, 0), gt(0, 20, 0)};
  const std::vector<Detection> d = {det(0, 50, 50, .9), det(0, 0, 0, .1),
                                    det(0, 20, 0, .5, "a", Source::kStrong),
                                    det(0, 70, 70, .4, "a", Source::kStrong)};
  EXPECT_DOUBLE_EQ(ap(g, d, ApMetric::kPooled11), 0.5);
}

TEST(RouteAp, NoGroundTruthIsAnError) {
  auto r = evaluate_ap({}, {det(0, 0, 0, .5)}, ApMetric::kVoc07, ApOptions{});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(RouteDetections, ParseRoundTripAndErrors) {
  auto d = parse_detections("# header\n3,1,10.5,20,30,40,0.75,person\n\n4.0,-1,0,0,1,1,1,cat\n",
                            "t", Source::kStrong);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)[0].frame, 3);
  EXPECT_DOUBLE_EQ((*d)[0].box.left, 10.5);
  EXPECT_DOUBLE_EQ((*d)[0].score, 0.75);
  EXPECT_EQ((*d)[1].cls, "cat");
  auto again = parse_detections(format_detections(*d), "t2", Source::kStrong);
  ASSERT_TRUE(again.ok());
  EXPECT_DOUBLE_EQ((*again)[0].box.left, 10.5);
  for (const char* bad : {"1,2,3\n", "x,1,0,0,1,1,1,a\n", "1,1,0,0,-1,1,1,a\n",
                          "1,1,0,0,1,1,nan,a\n", "1,1,0,0,1,1,1,\n", "1.5,1,0,0,1,1,1,a\n"}) {
    auto r = parse_detections(bad, "bad.txt", Source::kWeak);
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << bad;
  }
  auto g = parse_ground_truth("0,1,0,0,5,5,1,dog,1\n", "g");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE((*g)[0].difficult);
  EXPECT_FALSE(parse_ground_truth("0,1,0,0,5,5,1,dog,2\n", "g").ok());
}

}  // namespace
}  // namespace ferry::route
