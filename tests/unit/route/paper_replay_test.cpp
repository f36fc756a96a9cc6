// SPDX-License-Identifier: Apache-2.0
// Replaying ../shared/data/bgt-ada/paper-data reproduces route.md's targets: ρ_frontier 0.3,
// ρ_ceiling 0.8, the envelope (== adaptive_envelope.csv row by row), the AUCs
// (0.7949 / 0.7941 / 0.7960 / 0.7774 / 0.8160, and the summary file's unrounded values) and the
// cost figures (19.15 ms, 29.7 %, 3.888 GFLOPs, break-evens 0.1247 / 0.0341, 29.3x), compared at
// the precision route.md prints them.
#include "route/paper_replay.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "route_test_util.h"

namespace ferry::route {
namespace {

std::string paper_dir() { return testing::shared_dir() + "/data/bgt-ada/paper-data"; }

class PaperReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = replay_paper_data(paper_dir());
    ASSERT_TRUE(r.ok()) << "cannot replay the artifact data at " << paper_dir()
                        << " (shared/ must sit beside the clone): " << r.status().to_string();
    p_ = std::move(r).value();
  }
  PaperReplay p_;
};

TEST_F(PaperReplayTest, FrontierAndCeiling) {
  EXPECT_EQ(p_.envelope.frontier, 0.3);
  EXPECT_EQ(p_.envelope.ceiling, 0.8);
  const Router router(p_.envelope);
  EXPECT_EQ(router.placement(0.2), Placement::kCond);
  EXPECT_EQ(router.placement(0.3), Placement::kSkip);
  EXPECT_EQ(router.placement(0.7), Placement::kSkip);
  EXPECT_EQ(router.placement(0.8), Placement::kCond);
  auto back = Router::from_json(router.to_json());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->table(), router.table());
}

TEST_F(PaperReplayTest, EnvelopeMatchesArtifactFile) {
  auto t = CsvTable::load(paper_dir() + "/adaptive_envelope.csv");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->rows(), p_.envelope.ratio.size());
  for (std::size_t i = 0; i < t->rows(); ++i) {
    EXPECT_EQ(*t->number(i, "ratio"), p_.envelope.ratio[i]);
    EXPECT_EQ(*t->number(i, "mAP"), p_.envelope.map[i]) << "row " << i;  // a max: exact
  }
}

TEST_F(PaperReplayTest, AucsAsPrinted) {
  const auto f4 = [](double v) { return fmt::format("{:.4f}", v); };
  EXPECT_EQ(f4(p_.auc.at(kPaperSkipEstimator)), "0.7949");
  EXPECT_EQ(f4(p_.auc.at(kPaperCondEstimator)), "0.7941");
  EXPECT_EQ(f4(p_.auc.at("adaptive")), "0.7960");
  EXPECT_EQ(f4(p_.auc.at("random")), "0.7774");
  EXPECT_EQ(f4(p_.auc.at("oracle")), "0.8160");
  // Unrounded: the artifact's own offloading_summary.csv auc_0_5 column.
  auto s = CsvTable::load(paper_dir() + "/offloading_summary.csv");
  ASSERT_TRUE(s.ok());
  int checked = 0;
  for (std::size_t r = 0; r < s->rows(); ++r) {
    const std::string name = *s->cell(r, "estimator");
    auto a = s->number(r, "auc_0_5");
    if (!a.ok() || !p_.auc.count(name)) continue;  // DCSB has no curve/AUC
    EXPECT_NEAR(p_.auc.at(name), *a, 1e-12) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 6);  // 4 estimators + random + oracle
}

TEST_F(PaperReplayTest, PeaksAsPrinted) {
  const auto f4 = [](double v) { return fmt::format("{:.4f}", v); };
  EXPECT_EQ(f4(p_.peak.at(kPaperSkipEstimator)), "0.8076");
  EXPECT_EQ(f4(p_.peak.at(kPaperCondEstimator)), "0.8040");
  // Strong-only and weak-only are every curve's end points (ρ = 1 and ρ = 0).
  const Curve& skip = p_.curves.at(kPaperSkipEstimator);
  EXPECT_EQ(f4(skip.map.back()), "0.7908");
  EXPECT_EQ(f4(skip.map.front()), "0.7599");
  EXPECT_EQ(f4(p_.peak.at("oracle")), "0.8273");
}

TEST_F(PaperReplayTest, CostFiguresAsPrinted) {
  EXPECT_EQ(fmt::format("{:.2f}", p_.saving_ms), "19.15");
  EXPECT_EQ(fmt::format("{:.1f}", p_.saving_pct), "29.7");
  EXPECT_EQ(fmt::format("{:.3f}", p_.gflops_saved), "3.888");
  EXPECT_EQ(fmt::format("{:.4f}", p_.latency_break_even), "0.1247");
  EXPECT_EQ(fmt::format("{:.4f}", p_.compute_break_even), "0.0341");
  EXPECT_EQ(fmt::format("{:.1f}", p_.lightness), "29.3");
}

TEST_F(PaperReplayTest, PaperRouterDoesNotTakeItsClaimedSavingAtHighRho) {
  // The known flaw: at ρ = 0.8-0.9 the paper router picks conditioned, so the 19.15 ms saving it
  // quotes at 0.9 is not realised. A cost-aware router with λ = 0.001 mAP/ms takes it.
  const Router paper(p_.envelope);
  EXPECT_EQ(paper.placement(0.9), Placement::kCond);
  auto ca = cost_aware_router(p_.cost, p_.curves.at(kPaperSkipEstimator),
                              p_.curves.at(kPaperCondEstimator), 0.001);
  ASSERT_TRUE(ca.ok());
  EXPECT_EQ(ca->placement(0.9), Placement::kSkip);
  EXPECT_EQ(ca->placement(0.1), Placement::kCond);  // below break-even skipping is slower too
  // λ = 0 is the paper's accuracy-only rule.
  auto acc = cost_aware_router(p_.cost, p_.curves.at(kPaperSkipEstimator),
                               p_.curves.at(kPaperCondEstimator), 0.0);
  ASSERT_TRUE(acc.ok());
  EXPECT_EQ(acc->table(), paper.table());
}

}  // namespace
}  // namespace ferry::route
