// SPDX-License-Identifier: Apache-2.0
// The live MV-WSA decision rule (serve/wsa/split_controller.h) over live curves from a
// stationary calibrated routing trace (four MoE layers) and a KV demand signal:
//   - every split it holds is feasible (budget, slot range, KV floor) at every decision;
//   - on the stationary trace it settles: at most two moves in all, none in the second half;
//   - while it keeps a split, that split's modelled step time is within the hysteresis bound of
//     the allocator's optimum on the same curves: T(current) - T(opt) < max(h * T(current),
//     migration_s / horizon_steps), the exact rule it applies;
//   - it is not frozen: when the KV demand jumps above the held KV blocks, it moves.
#include <gtest/gtest.h>

#include "serve/trace_synth.h"
#include "serve/wsa/demand.h"
#include "serve/wsa/split_controller.h"

namespace ferry::serve::wsa {
namespace {

TEST(WsaController, SettlesOnAStationaryTraceAndFollowsADemandJump) {
  constexpr int kLayers = 4, kExperts = 32, kTopK = 4, kTokens = 6000, kEvery = 100;
  const RoutingTrace t = make_synthetic_trace({.experts = kExperts,
                                               .top_k = kTopK,
                                               .moe_layers = {0, 1, 2, 3},
                                               .prefill_tokens = 0,
                                               .decode_tokens = kTokens,
                                               .seed = 4});
  CostModel m{.budget_bytes = 0,
              .expert_bytes = 1 << 20,
              .kv_block_bytes = 1 << 18,
              .min_slots = kTopK,
              .kv_floor_blocks = 16,
              .kv_max_blocks = 512,
              .link_bytes_per_s = 1e9,
              .kv_block_cost_s = 2e-4};
  m.budget_bytes = std::size_t(kLayers) * 14 * m.expert_bytes + 64 * m.kv_block_bytes;
  const ControllerConfig cc{.hysteresis = 0.05, .horizon_steps = 256, .link_bytes_per_s = 1e9};
  const SplitController ctl(cc);
  std::vector<StackDistance> sd(kLayers, StackDistance(kExperts));
  KvDemand kv(256);
  double demand = 40;  // blocks wanted per step (stationary until the jump)
  int moves = 0, late_moves = 0, decisions = 0;
  bool moved_after_jump = false;
  std::optional<Split> current;
  double steps = 0;
  for (int pos = 0; pos < kTokens; ++pos) {
    for (int l = 0; l < kLayers; ++l) {
      for (std::int32_t e : t.routes.at(RouteKey{0, pos, l})) sd[std::size_t(l)].access(e);
    }
    kv.record(demand);
    steps += 1;
    if ((pos + 1) % kEvery != 0) continue;
    const SplitProblem p = make_problem(m, sd, steps, kv.samples());
    if (!current) {
      auto half = fraction_split(p, 0.5);
      ASSERT_TRUE(half.ok()) << half.status().to_string();
      current = *half;
    }
    auto d = ctl.decide(p, *current);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    ++decisions;
    if (d->move) {
      current = d->target;
      ++moves;
      if (pos >= kTokens / 2 && pos < 5 * kTokens / 6) ++late_moves;
      if (pos >= 5 * kTokens / 6) moved_after_jump = true;
    } else {
      const double gap = d->current_s - d->target_s;
      EXPECT_LE(gap, std::max(cc.hysteresis * d->current_s, d->migration_s / cc.horizon_steps))
          << "kept a split outside the hysteresis band at token " << pos;
    }
    EXPECT_TRUE(feasible(p, *current)) << "token " << pos;
    EXPECT_LE(current->bytes(p), m.budget_bytes);
    EXPECT_GE(current->kv_blocks, m.kv_floor_blocks);
    // Age the live curves: half weight per window.
    for (auto& s : sd) s.scale(0.5);
    steps *= 0.5;
    // The jump: after 5/6 of the trace the KV demand outgrows what the split holds.
    if (pos + 1 == 5 * kTokens / 6) demand = current->kv_blocks + 120.0;
  }
  EXPECT_EQ(decisions, kTokens / kEvery);
  EXPECT_LE(moves - int(moved_after_jump), 2) << "oscillating on a stationary trace";
  EXPECT_EQ(late_moves, 0) << "moved in the stationary second half";
  EXPECT_TRUE(moved_after_jump) << "did not follow a KV demand jump";
}

}  // namespace
}  // namespace ferry::serve::wsa
