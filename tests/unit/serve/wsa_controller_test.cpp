// SPDX-License-Identifier: Apache-2.0
// The live MV-WSA decision rule (serve/wsa/split_controller.h) over live curves from a
// stationary calibrated routing trace (four MoE layers) and a KV demand signal:
//   - every split it holds is feasible (budget, slot range, KV floor) at every decision;
//   - on the stationary trace it settles: at most two moves in all, none in the second half;
//   - while it keeps a split, that split's modelled step time is within the hysteresis bound of
//     the allocator's optimum on the same curves: T(current) - T(opt) < max(h * T(current),
//     migration_s / horizon_steps), the exact rule it applies;
//   - it is not frozen: when the KV demand jumps above the held KV blocks, it moves;
//   - its cadence follows observed accesses within [min_steps, max_steps] and ages per step;
//   - near-ties between the allocator's split and a uniform one go to the uniform split;
//   - its band shrinks from the hysteresis to min_hysteresis as the curves' counts grow.
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
      EXPECT_LE(gap, std::max(d->threshold_s, d->migration_s / cc.horizon_steps))
          << "kept a split outside the hysteresis band at token " << pos;
      EXPECT_GE(d->band, std::min(cc.hysteresis, ControllerConfig{}.min_hysteresis));
      EXPECT_LE(d->band, cc.hysteresis);
    }
    EXPECT_NEAR(d->threshold_s, d->band * (d->current_s - d->floor_s), 1e-15);
    EXPECT_LE(d->target_s - d->floor_s,
              (d->optimum_s - d->floor_s) * (1 + ControllerConfig{}.uniform_tie) + 1e-15);
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

TEST(WsaController, CadenceFollowsAccessesWithinItsStepBoundsAndAgesPerStep) {
  // 128 accesses per layer and step (a prefill step of E = 128), 4 layers: due after min_steps
  // = 4 steps once 2 E = 256 per layer arrived -- so at step 4, not 64.
  DecisionCadence prefill({.min_steps = 4, .max_steps = 64, .accesses_per_decision = 256});
  int at = 0;
  for (int step = 1; step <= 64 && at == 0; ++step) {
    if (prefill.step(4 * 128, 4)) at = step;
  }
  EXPECT_EQ(at, 4);
  // 20 accesses per layer and step (decode): 256 / 20 -> the 13th step.
  DecisionCadence decode({.min_steps = 4, .max_steps = 64, .accesses_per_decision = 256});
  at = 0;
  for (int step = 1; step <= 64 && at == 0; ++step) {
    if (decode.step(4 * 20, 4)) at = step;
  }
  EXPECT_EQ(at, 13);
  // Nothing observed: the fixed interval bounds it; accesses_per_decision 0 is that interval only.
  for (double per : {256.0, 0.0}) {
    DecisionCadence idle({.min_steps = 4, .max_steps = 64, .accesses_per_decision = per});
    at = 0;
    for (int step = 1; step <= 100 && at == 0; ++step) {
      if (idle.step(per > 0 ? 0 : 4 * 128, 4)) at = step;
    }
    EXPECT_EQ(at, 64) << per;
  }
  // Ageing is per step: 128 steps cost age^2 whether decided twice or 32 times.
  DecisionCadence fast({.min_steps = 4, .max_steps = 64, .accesses_per_decision = 1});
  DecisionCadence slow({.min_steps = 4, .max_steps = 64, .accesses_per_decision = 0});
  double f_fast = 1, f_slow = 1;
  for (int step = 1; step <= 128; ++step) {
    if (fast.step(4, 4)) f_fast *= fast.decided();
    if (slow.step(4, 4)) f_slow *= slow.decided();
  }
  EXPECT_NEAR(f_fast, 0.81, 1e-12);
  EXPECT_NEAR(f_slow, 0.81, 1e-12);
}

// Two MoE layers whose curves are straight lines (prefill-like: every slot saves the same), one
// a hair steeper: the allocator puts every spare slot into that layer; the controller takes the
// uniform split, as good within uniform_tie, instead.
TEST(WsaController, NearTiesGoToTheUniformSplit) {
  SplitProblem p;
  p.expert_bytes = 100;
  p.kv_block_bytes = 10;
  p.min_slots = 2;
  p.kv_floor_blocks = 4;
  p.miss_cost_s = 1e-3;
  p.kv_block_cost_s = 1e-3;
  p.kv_short.assign(41, 0.0);
  p.budget_bytes = 2 * 10 * 100 + 4 * 10;  // 10 slots per layer on average + the KV floor
  p.curve_steps = 1e6;
  for (double slope : {1.0, 1.002}) {
    std::vector<double> m(17);
    for (int c = 0; c <= 16; ++c) m[std::size_t(c)] = slope * (16 - c);
    p.expert_misses.push_back(m);
  }
  auto opt = allocate(p);
  ASSERT_TRUE(opt.ok()) << opt.status().to_string();
  EXPECT_NE(opt->slots[0], opt->slots[1]) << "the allocator should prefer the steeper layer";
  const SplitController ctl({.link_bytes_per_s = 0});
  const Split start{.slots = {2, 2}, .kv_blocks = 4};
  auto d = ctl.decide(p, start);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->target.slots, (std::vector<int>{10, 10}));
  EXPECT_LE(d->target_s, d->optimum_s * 1.01);
  EXPECT_TRUE(d->move);
  // Without the tie rule it takes the allocator's corner.
  const SplitController corner({.link_bytes_per_s = 0, .uniform_tie = 0});
  auto d2 = corner.decide(p, start);
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(d2->target, *opt);
}

// The band is the full hysteresis on curves from few steps and shrinks to min_hysteresis as the
// same per-step curves rest on more steps.
TEST(WsaController, BandShrinksWithCurveConfidence) {
  SplitProblem p;
  p.expert_bytes = 100;
  p.kv_block_bytes = 10;
  p.min_slots = 1;
  p.kv_floor_blocks = 4;
  p.miss_cost_s = 1e-3;
  p.kv_block_cost_s = 1e-3;
  p.kv_short.assign(41, 0.0);
  p.budget_bytes = 8 * 100 + 4 * 10;
  std::vector<double> m(9);
  for (int c = 0; c <= 8; ++c) m[std::size_t(c)] = 4.0 / (1 + c);  // convex, per step
  p.expert_misses = {m};
  const SplitController ctl({});
  const Split start{.slots = {7}, .kv_blocks = 14};  // one slot short of the optimum (8 slots)
  std::vector<double> bands;
  for (double steps : {2.0, 2e5, 2e8}) {
    p.curve_steps = steps;
    auto d = ctl.decide(p, start);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->target.slots[0], 8);
    bands.push_back(d->band);
  }
  EXPECT_EQ(bands[0], ControllerConfig{}.hysteresis);
  EXPECT_LT(bands[1], bands[0]);
  EXPECT_EQ(bands[2], ControllerConfig{}.min_hysteresis);
}

// A recomputed prompt block priced at each split's caps (ControllerConfig::price_by_caps): two
// MoE layers, a KV block saving 0.6 ms a step at the profile's one price (1.2 ms: the block at
// 4 slots per layer) against a slot's 0.5 ms, so allocate() gives experts the minimum (2 slots,
// 32 blocks), a self-consistent split (its price, 1.4 ms, still favours KV). At 16 slots
// recomputing a block costs nothing in misses (a chunk then hits every expert), and that split is
// 5.7x faster by the cap-priced T. Off, the controller keeps the one-price optimum; on, it moves
// to 16 slots; without the per-cap curves on is off.
TEST(WsaController, PricedByCapsFindsTheFarOptimum) {
  SplitProblem p;
  p.expert_bytes = 1000;
  p.kv_block_bytes = 1000;
  p.min_slots = 2;
  p.kv_floor_blocks = 4;
  p.miss_cost_s = 1e-3;
  p.kv_block_cost_s = 1e-3;
  p.kv_short.assign(37, 0.0);
  p.budget_bytes = 36 * 1000;  // 2 x c slots + k blocks
  p.curve_steps = 1e6;
  for (int l = 0; l < 2; ++l) {
    std::vector<double> m(17), r(17);
    for (int c = 0; c <= 16; ++c) {
      m[std::size_t(c)] = 0.5 * (16 - c);   // misses per step
      r[std::size_t(c)] = 0.05 * (16 - c);  // misses per recomputed block
    }
    p.expert_misses.push_back(m);
    p.recompute_misses.push_back(r);
  }
  p.kv_prefix_misses.assign(37, 0.0);
  for (int k = 0; k <= 32; ++k) p.kv_prefix_misses[std::size_t(k)] = 0.5 * (32 - k);
  p.prefix_block_cost_s = 1.2e-3;  // = prefix_block_cost_at 4 slots per layer
  p.prefix_block_base_s = 0;
  p.prefix_misses_seen = p.kv_prefix_misses[28];  // the profiled split: 4 slots, 28 blocks
  const Split one_shot{.slots = {2, 2}, .kv_blocks = 32}, far{.slots = {16, 16}, .kv_blocks = 4};
  ASSERT_TRUE(allocate(p).ok());
  EXPECT_EQ(*allocate(p), one_shot);
  EXPECT_NEAR(prefix_block_cost_at(p, {.slots = {4, 4}, .kv_blocks = 28}), 1.2e-3, 1e-15);
  EXPECT_NEAR(modelled_step_priced_by_caps_s(p, one_shot), 13.6e-3, 1e-12);
  EXPECT_NEAR(modelled_step_priced_by_caps_s(p, far), 2.4e-3, 1e-12);

  const SplitController off({.link_bytes_per_s = 0});
  auto d0 = off.decide(p, one_shot);
  ASSERT_TRUE(d0.ok()) << d0.status().to_string();
  EXPECT_EQ(d0->target, one_shot);
  EXPECT_FALSE(d0->move);

  const SplitController on({.link_bytes_per_s = 0, .price_by_caps = true});
  auto d1 = on.decide(p, one_shot);
  ASSERT_TRUE(d1.ok()) << d1.status().to_string();
  EXPECT_EQ(d1->target, far);
  EXPECT_TRUE(d1->move);
  EXPECT_TRUE(feasible(p, d1->target));
  EXPECT_NEAR(d1->current_s, 13.6e-3, 1e-12);
  EXPECT_NEAR(d1->target_s, 2.4e-3, 1e-12);
  EXPECT_LE(d1->floor_s, d1->target_s);
  // Held at the far optimum, it stays there.
  auto d2 = on.decide(p, far);
  ASSERT_TRUE(d2.ok());
  EXPECT_FALSE(d2->move);

  // Without the per-cap curves, on decides as off.
  SplitProblem q = p;
  q.recompute_misses.clear();
  auto d3 = on.decide(q, one_shot);
  ASSERT_TRUE(d3.ok());
  EXPECT_EQ(d3->target, d0->target);
  EXPECT_EQ(d3->current_s, d0->current_s);
  EXPECT_FALSE(d3->move);
}

}  // namespace
}  // namespace ferry::serve::wsa
