// SPDX-License-Identifier: Apache-2.0
// ORIC identities and incremental == full recomputation; sampled contexts cover every frame.
#include "route/oric.h"

#include <gtest/gtest.h>

#include "route_test_util.h"

namespace ferry::route {
namespace {

TEST(RouteOric, IncrementalEqualsFullRecomputation) {
  const auto s = testing::random_set(120, 7);
  auto sc = OricScorer::build(s.frames, s.gts, s.weak, s.strong, OricOptions{});
  ASSERT_TRUE(sc.ok()) << sc.status().to_string();
  int nonzero = 0;
  for (int slot = 0; slot < sc->num_frames(); ++slot) {
    const double inc = sc->swapped_ap(slot), full = sc->swapped_ap_full(slot);
    // Same ranked multiset, same tie groups -> the same arithmetic: bit-identical.
    ASSERT_EQ(inc, full) << "slot " << slot;
    nonzero += inc != sc->base_ap();
  }
  EXPECT_GT(nonzero, 10) << "the random set should make many swaps matter";
}

TEST(RouteOric, AllPointVariantAlsoMatches) {
  const auto s = testing::random_set(60, 11);
  OricOptions o;
  o.interp = ApInterp::kAllPoint;
  auto sc = OricScorer::build(s.frames, s.gts, s.weak, s.strong, o);
  ASSERT_TRUE(sc.ok());
  for (int slot = 0; slot < sc->num_frames(); ++slot) {
    ASSERT_EQ(sc->swapped_ap(slot), sc->swapped_ap_full(slot)) << slot;
  }
}

TEST(RouteOric, StrongEqualsWeakGivesZero) {
  const auto s = testing::random_set(80, 3);
  std::vector<Detection> same = s.weak;
  for (auto& d : same) d.source = Source::kStrong;
  auto sc = OricScorer::build(s.frames, s.gts, s.weak, same, OricOptions{});
  ASSERT_TRUE(sc.ok());
  for (double v : sc->oric_all()) ASSERT_EQ(v, 0.0);
}

TEST(RouteOric, OffloadingEveryFrameGivesStrongOnlyAp) {
  const auto s = testing::random_set(100, 5);
  auto sc = OricScorer::build(s.frames, s.gts, s.weak, s.strong, OricOptions{});
  ASSERT_TRUE(sc.ok());
  auto strong_only = evaluate_ap(s.gts, s.strong, ApMetric::kPooled11, ApOptions{});
  auto weak_only = evaluate_ap(s.gts, s.weak, ApMetric::kPooled11, ApOptions{});
  ASSERT_TRUE(strong_only.ok() && weak_only.ok());
  EXPECT_EQ(sc->strong_ap(), strong_only->mean);
  EXPECT_EQ(sc->ap_with_offloaded(std::vector<std::uint8_t>(100, 0)), weak_only->mean);
  EXPECT_EQ(sc->base_ap(), weak_only->mean);
  EXPECT_GT(strong_only->mean, weak_only->mean);  // the generator's strong model is better
  // A one-frame offload set through the general path equals the swap path.
  std::vector<std::uint8_t> one(100, 0);
  one[17] = 1;
  EXPECT_EQ(sc->ap_with_offloaded(one), sc->swapped_ap(17));
}

TEST(RouteOric, SampledContextsScoreEveryFrameAndDeterministically) {
  const auto s = testing::random_set(90, 9);
  auto a = oric_sampled(s.frames, s.gts, s.weak, s.strong, OricOptions{}, 30, 3, 42);
  auto b = oric_sampled(s.frames, s.gts, s.weak, s.strong, OricOptions{}, 30, 3, 42);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  // One round with one context of all frames equals the whole-context ORIC.
  auto whole = oric_sampled(s.frames, s.gts, s.weak, s.strong, OricOptions{}, 90, 1, 1);
  auto sc = OricScorer::build(s.frames, s.gts, s.weak, s.strong, OricOptions{});
  ASSERT_TRUE(whole.ok() && sc.ok());
  EXPECT_EQ(*whole, sc->oric_all());
  EXPECT_FALSE(oric_sampled(s.frames, s.gts, s.weak, s.strong, OricOptions{}, 1, 1, 1).ok());
}

TEST(RouteOric, ContextWithoutObjectsIsAnError) {
  auto sc = OricScorer::build({0, 1}, {}, {}, {}, OricOptions{});
  EXPECT_EQ(sc.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::route
