// SPDX-License-Identifier: Apache-2.0
// The split simulator and the agentic workload (serve/wsa/split_sim.h, agentic_workload.h) on a
// small geometry: the workload's shape (prefix, turns, contexts that grow by each turn), every
// policy generating every answer token, the simulated misses of a fixed split without preemption
// equal to its own profile's Mattson curve at that cap, and the live policy staying feasible.
#include <gtest/gtest.h>

#include "serve/wsa/split_sim.h"

namespace ferry::serve::wsa {
namespace {

AgenticSpec small_spec() {
  return {.sessions = 5,
          .turns = 3,
          .prefix_tokens = 96,
          .user_min = 8,
          .user_max = 24,
          .output_min = 8,
          .output_max = 24,
          .moe_layers = 3,
          .experts = 16,
          .top_k = 2,
          .seed = 3};
}

TEST(WsaAgenticWorkload, SessionsGrowTurnByTurn) {
  const AgenticWorkload w(small_spec());
  for (int s = 0; s < w.sessions(); ++s) {
    const auto& t = w.turns(s);
    ASSERT_EQ(t.size(), 3u);
    EXPECT_GE(t[0].context, 84);
    EXPECT_LE(t[0].context, 108);
    for (std::size_t i = 1; i < t.size(); ++i) {
      EXPECT_EQ(t[i].context, t[i - 1].prompt() + t[i - 1].output);
    }
    const auto p0 = w.turn_prompt(s, 0, 259), p1 = w.turn_prompt(s, 1, 259);
    ASSERT_EQ(int(p1.size()), t[1].prompt());
    // A later turn re-sends the earlier context unchanged.
    EXPECT_TRUE(std::equal(p0.begin(), p0.end(), p1.begin()));
    for (int p = 0; p < w.session_tokens(s); ++p) {
      auto r = w.route(s, p, 2);
      ASSERT_EQ(r.size(), 2u);
      EXPECT_NE(r[0], r[1]);
      EXPECT_LT(r[0], 16);
    }
  }
}

TEST(WsaSplitSim, PoliciesFinishEveryTurnAndProfilesMatchTheRun) {
  const AgenticWorkload w(small_spec());
  SimConfig cfg;
  cfg.expert_bytes = 1000;
  cfg.kv_bytes_per_token = 10;
  cfg.block_tokens = 4;
  cfg.max_running = 3;
  cfg.max_batch_tokens = 64;
  cfg.link_bytes_per_s = 1e6;
  cfg.kv_floor_blocks = (w.max_context() + 3) / 4;
  cfg.budget_bytes = 3 * 10 * 1000 + std::size_t(cfg.kv_floor_blocks) * 40 * 2;
  cfg.decide_every_steps = 4;
  cfg.controller = {.hysteresis = 0.05, .horizon_steps = 64, .link_bytes_per_s = 1e6};
  const SplitProblem skel = sim_problem(cfg, 3, 16, 2);
  std::uint64_t want_tokens = 0;
  for (int s = 0; s < w.sessions(); ++s) {
    for (const auto& t : w.turns(s)) want_tokens += std::uint64_t(t.output);
  }
  const std::vector<Split> uniform = all_uniform_splits(skel);
  ASSERT_GE(uniform.size(), 3u);
  for (const Split& u : uniform) {
    auto r = simulate(cfg, w, u, false);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->generated, want_tokens);
    EXPECT_GT(r->total_s, 0);
    if (r->preemptions == 0) {
      // Same accesses, so the profile's exact LRU curve predicts this run's misses at its cap.
      double predicted = 0;
      for (const auto& m : r->profile.expert_misses) predicted += m[std::size_t(u.slots[0])];
      EXPECT_NEAR(predicted * double(r->steps), double(r->misses), 1e-6 * double(r->misses + 1))
          << "cap " << u.slots[0];
    }
  }
  auto half = fraction_split(skel, 0.5);
  ASSERT_TRUE(half.ok());
  auto live = simulate(cfg, w, *half, true);
  ASSERT_TRUE(live.ok()) << live.status().to_string();
  EXPECT_EQ(live->generated, want_tokens);
  EXPECT_TRUE(feasible(skel, live->final_split));
}

}  // namespace
}  // namespace ferry::serve::wsa
