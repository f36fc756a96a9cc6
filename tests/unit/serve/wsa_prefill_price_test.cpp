// SPDX-License-Identifier: Apache-2.0
// The price of a prompt block the prefix cache did not find (serve/wsa/demand.h PrefillCost,
// SplitProblem::prefix_block_cost_s): it must be what recomputing a block costs. The simulator
// measures that directly: the same workload and split with the prefix cache on and off differ only
// in the prompt blocks recomputed, so (total off - total on) / (blocks recomputed in addition) is
// the marginal cost of one block. The workload is the phased mix with short chat turns
// (docs/serve_wsa.md, 16 x 6, user <= 128, answers <= 64) at a quarter of its token counts and
// half its sessions: the
// prefill a profile sees is mostly small chunks (a chat turn's new user tokens after a prefix hit),
// while a recomputed history comes back in full chunks of max_batch_tokens. A step's expert misses
// saturate at E per layer, so the first version's price (every step's time shared by token) charged
// a small chunk's misses, the step's base and the decode tokens' own misses to its few prefill
// tokens: 1.98 ms per block here where recomputing one costs 1.08 ms (1.68 vs 1.08 on the bench
// mix), and the configurator kept KV for histories that expert slots outvalue (0.892x the
// oracle there). Plus the estimator's own rules: the proportional fallback without a full step, a
// zero baseline without a decode-only step, ageing.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "serve/wsa/demand.h"
#include "serve/wsa/split_allocator.h"
#include "serve/wsa/split_sim.h"
#include "wsa_random_problem.h"

namespace ferry::serve::wsa {
namespace {

AgenticSpec short_turns_spec(std::uint64_t seed) {
  return {.sessions = 8,
          .turns = 6,
          .prefix_tokens = 384,
          .user_min = 8,
          .user_max = 32,
          .output_min = 4,
          .output_max = 16,
          .phase_turns = 2,
          .long_output_min = 128,
          .long_output_max = 256,
          .moe_layers = 2,
          .experts = 128,
          .top_k = 8,
          .seed = seed};
}

// The 2-layer H200 fit's step model (1.6 ms per step, 0.197 ms per miss, no per-token cost) with
// blocks and chunks a quarter of the bench's; the budget is 95 slots, as the bench's 2-layer pool.
SimConfig short_turns_config(const AgenticWorkload& w, bool prefix_cache) {
  SimConfig cfg;
  cfg.expert_bytes = 7200;
  cfg.kv_bytes_per_token = 20;
  cfg.block_tokens = 4;
  cfg.max_running = 4;
  cfg.max_batch_tokens = 128;
  cfg.step_base_s = 1.6e-3;
  cfg.token_s = 0;
  cfg.link_bytes_per_s = 7200 / 0.197e-3;
  cfg.prefix_cache = prefix_cache;
  cfg.kv_floor_blocks = cfg.max_running * ((w.max_context() + 3) / 4);
  cfg.budget_bytes = 95 * cfg.expert_bytes;
  return cfg;
}

TEST(WsaPrefillPrice, RecomputedBlockIsPricedAtWhatRecomputingItCosts) {
  for (std::uint64_t seed : {1, 2}) {
    const AgenticWorkload w(short_turns_spec(seed));
    const SimConfig on_cfg = short_turns_config(w, true), off_cfg = short_turns_config(w, false);
    const SplitProblem skel = sim_problem(on_cfg, 2, 128, 8);
    auto half = fraction_split(skel, 0.5);  // the bench's profiling run
    ASSERT_TRUE(half.ok()) << half.status().to_string();
    auto on = simulate(on_cfg, w, *half, false);
    auto off = simulate(off_cfg, w, *half, false);
    ASSERT_TRUE(on.ok() && off.ok());
    ASSERT_EQ(on->generated, off->generated);
    // The pool holds the histories at 50/50: without the cache they are recomputed.
    ASSERT_GT(on->prefix_hit_blocks, 0u);
    ASSERT_GT(off->prefill_tokens, on->prefill_tokens + 1000u * 4u);
    const double recomputed_blocks =
        double(off->prefill_tokens - on->prefill_tokens) / double(on_cfg.block_tokens);
    const double marginal_s = (off->total_s - on->total_s) / recomputed_blocks;
    const double price_s = on->profile.prefix_block_cost_s;
    ASSERT_GT(marginal_s, 0);
    // 10 %: the price is measured at the profile's own split and traffic, the marginal over the
    // extra chunks; they differ by what a chunk's neighbours in the batch and the LRU's state
    // make of it (4.5 % and 4.9 % above it in these runs: 1.128 vs 1.079 and 1.135 vs 1.082 ms).
    // The first version's price was 1.83x the marginal here (1.977 and 1.984 ms).
    EXPECT_NEAR(price_s, marginal_s, 0.10 * marginal_s)
        << "seed " << seed << ": price " << price_s * 1e3 << " ms per block, recomputing costs "
        << marginal_s * 1e3 << " ms per block";
  }
}

TEST(WsaPrefillPrice, FullChunksAboveDecodeStepsWithFallbacks) {
  // Steps of a saturating cost: decode-only 10 ms, a 16-token chat chunk (plus 3 decode tokens)
  // 40 ms, a full chunk of 64 tokens (61 prefill) 60 ms.
  PrefillCost c(64);
  EXPECT_DOUBLE_EQ(c.per_token_s(0.5), 0.5);  // nothing observed: the fallback
  c.add(0.040, 19, 16);
  c.add(0.040, 19, 16);
  // No full chunk yet: the proportional share, (2 x 40 x 16 / 19) / 32 tokens.
  EXPECT_DOUBLE_EQ(c.per_token_s(0.5), 0.040 / 19);
  c.add(0.060, 64, 61);
  // A full chunk, no decode-only step yet: baseline 0.
  EXPECT_DOUBLE_EQ(c.per_token_s(0.5), 0.060 / 61);
  for (int i = 0; i < 4; ++i) c.add(0.010, 4, 0);
  c.add(0.060, 64, 61);
  EXPECT_DOUBLE_EQ(c.per_token_s(0.5), (0.060 - 0.010) / 61);
  // The first version's price on the same steps: 2 chat chunks and 2 full ones, shared by token.
  const double proportional = (2 * 0.040 * 16 / 19 + 2 * 0.060 * 61 / 64) / (2 * 16 + 2 * 61);
  EXPECT_DOUBLE_EQ(c.proportional_s(0.5), proportional);
  EXPECT_GT(c.proportional_s(0.5), 1.2 * c.per_token_s(0.5));
  // Ageing scales every count alike: the price of the same mix is unchanged.
  c.scale(0.25);
  EXPECT_NEAR(c.per_token_s(0.5), (0.060 - 0.010) / 61, 1e-15);
  // Without a batch limit no step is full: the proportional share.
  PrefillCost p;
  p.add(0.060, 64, 61);
  p.add(0.010, 4, 0);
  EXPECT_DOUBLE_EQ(p.per_token_s(0.5), 0.060 * 61 / 64 / 61);
}

// ChunkMisses (demand.h): a step's depths wait until its class is known, full chunks and
// decode-only steps count, other steps not; per_block = block_tokens x (full misses at c per full
// chunk - decode misses at c per decode step) / prefill tokens per full chunk.
TEST(WsaPrefillPrice, ChunkMissesPerBlockAtEveryCap) {
  ChunkMisses m(1, 4, 8);
  EXPECT_TRUE(m.per_block(4).empty());                                     // nothing observed
  const std::vector<std::pair<int, int>> full = {{1, 0}, {2, 1}, {5, 2}};  // 5 = E + 1: first
  m.add_layer(0, full);
  m.end_step(8, 8);                     // a full chunk: 8 tokens, all prefill
  EXPECT_TRUE(m.per_block(4).empty());  // no decode-only step yet
  const std::vector<std::pair<int, int>> decode = {{3, 3}};
  m.add_layer(0, decode);
  m.end_step(2, 0);  // decode-only
  const std::vector<std::pair<int, int>> chat = {{4, 0}};
  m.add_layer(0, chat);
  m.end_step(4, 4);  // a small chunk: neither, its depths dropped
  // Full misses at c = 0..4: 3 2 1 1 1; decode: 1 1 1 0 0; per block of 4 tokens: 4 / 8.
  const std::vector<std::vector<double>> want = {{1.0, 0.5, 0.0, 0.5, 0.5}};
  EXPECT_EQ(m.per_block(4), want);
  m.scale(0.5);  // ageing scales counts and steps alike
  EXPECT_EQ(m.per_block(4), want);
}

// The simulator's fixed-split profile carries the per-cap recompute misses; at the profiled
// split's own caps the price they give is PrefillCost's price of the same run (the simulator's
// misses are the set model's, so the histograms hold exactly the misses the step times charged),
// and it falls with the caps (a full chunk misses fewer experts at more slots). Without the
// prefix cache there is nothing to price.
TEST(WsaPrefillPrice, ProfilePricesARecomputedBlockAtEveryCap) {
  const AgenticWorkload w(short_turns_spec(3));
  const SimConfig cfg = short_turns_config(w, true);
  const SplitProblem skel = sim_problem(cfg, 2, 128, 8);
  auto half = fraction_split(skel, 0.5);
  ASSERT_TRUE(half.ok()) << half.status().to_string();
  auto r = simulate(cfg, w, *half, false);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const SplitProblem& p = r->profile;
  ASSERT_EQ(p.recompute_misses.size(), 2u);
  ASSERT_EQ(p.recompute_misses[0].size(), 129u);
  EXPECT_GT(p.prefix_block_cost_s, 0);
  EXPECT_NEAR(prefix_block_cost_at(p, *half), p.prefix_block_cost_s, 1e-9 * p.prefix_block_cost_s);
  EXPECT_NEAR(modelled_step_priced_by_caps_s(p, *half), modelled_step_s(p, *half),
              1e-12 * modelled_step_s(p, *half));
  EXPECT_EQ(p.prefix_block_base_s, 0.0);  // no per-token cost; the step's base cancels
  EXPECT_GT(p.prefix_misses_seen, 0);
  const std::vector<Split> uniform = all_uniform_splits(p);
  ASSERT_GE(uniform.size(), 2u);
  const Split& lo = uniform.front();
  const Split& hi = uniform.back();
  EXPECT_LT(prefix_block_cost_at(p, hi), 0.9 * prefix_block_cost_at(p, lo));
  std::printf("block price at %d / %d / %d slots: %.4f / %.4f / %.4f ms (profile %.4f)\n",
              lo.slots[0], half->slots[0], hi.slots[0], prefix_block_cost_at(p, lo) * 1e3,
              prefix_block_cost_at(p, *half) * 1e3, prefix_block_cost_at(p, hi) * 1e3,
              p.prefix_block_cost_s * 1e3);
  auto off = simulate(short_turns_config(w, false), w, *half, false);
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(off->profile.recompute_misses.empty());
}

// allocate_priced_by_caps on random problems with a prefix curve and per-cap recompute misses:
// feasible, and by the T with the block priced at each split's own caps never worse than
// allocate() at the profile's one price, than iterating price -> allocate from there, or than any
// uniform split; without recompute curves it is allocate().
TEST(WsaPrefillPrice, PricedByCapsIsNoWorseThanOneShotFixedPointOrUniform) {
  std::mt19937 rng(29);
  std::uniform_real_distribution<double> u(0, 1);
  auto curve = [&](std::mt19937& g, int n, bool) {  // non-increasing
    std::vector<double> y(std::size_t(n) + 1);
    y[std::size_t(n)] = u(g);
    for (int i = n - 1; i >= 0; --i) y[std::size_t(i)] = y[std::size_t(i) + 1] + u(g) * u(g) * 4;
    return y;
  };
  int better = 0, comparisons = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const int L = 1 + static_cast<int>(rng() % 3), E = 4 + static_cast<int>(rng() % 12);
    SplitProblem p = testing::random_problem(rng, L, E, 10 + static_cast<int>(rng() % 60),
                                             trial % 2 == 0, false, curve);
    p.kv_prefix_misses = curve(rng, p.kv_max_blocks(), false);
    p.prefix_block_cost_s = 1e-3 * (0.5 + 2 * u(rng));
    auto plain = allocate(p);
    auto same = allocate_priced_by_caps(p);
    ASSERT_TRUE(plain.ok() && same.ok());
    EXPECT_EQ(*same, *plain);  // no recompute curves: allocate()
    for (int l = 0; l < L; ++l) {
      std::vector<double> c = curve(rng, E, false);
      for (double& x : c) x *= 0.5;
      p.recompute_misses.push_back(std::move(c));
    }
    p.prefix_block_base_s = 1e-4 * u(rng);
    p.prefix_misses_seen = u(rng);
    auto got = allocate_priced_by_caps(p);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(feasible(p, *got)) << "trial " << trial;
    const double t = modelled_step_priced_by_caps_s(p, *got);
    const double tol = 1e-12 * std::max(1.0, t);
    EXPECT_LE(t, modelled_step_priced_by_caps_s(p, *plain) + tol) << "trial " << trial;
    better += t < modelled_step_priced_by_caps_s(p, *plain) - tol;
    Split cur = *plain;  // the fixed point from the one-shot split
    SplitProblem q = p;
    for (int round = 0; round < 50; ++round) {
      q.prefix_block_cost_s = prefix_block_cost_at(p, cur);
      auto s = allocate(q);
      ASSERT_TRUE(s.ok());
      if (*s == cur) break;
      cur = *s;
      EXPECT_LE(t, modelled_step_priced_by_caps_s(p, cur) + tol) << "trial " << trial;
    }
    // The live controller's starts (one uniform start, 2 rounds): never worse than allocate()'s
    // split or any uniform split either.
    auto live =
        allocate_priced_by_caps(p, {}, {.fixed_point_rounds = 2, .every_uniform_start = false});
    ASSERT_TRUE(live.ok());
    EXPECT_TRUE(feasible(p, *live)) << "trial " << trial;
    const double tl = modelled_step_priced_by_caps_s(p, *live);
    EXPECT_LE(tl, modelled_step_priced_by_caps_s(p, *plain) + tol) << "trial " << trial;
    EXPECT_LE(t, tl + tol) << "trial " << trial;
    for (const Split& un : all_uniform_splits(p)) {
      EXPECT_LE(t, modelled_step_priced_by_caps_s(p, un) + tol) << "trial " << trial;
      EXPECT_LE(tl, modelled_step_priced_by_caps_s(p, un) + tol) << "trial " << trial;
      ++comparisons;
    }
  }
  std::printf(
      "priced by caps: better than the one-shot split in %d of 150 problems, %d uniform "
      "comparisons\n",
      better, comparisons);
  EXPECT_GT(better, 0);
  EXPECT_GT(comparisons, 500);
}

// modelled_step_s at a given block price (what modelled_step_priced_by_caps_s uses instead of
// a copy of the problem per candidate) is, to the bit, modelled_step_s on a copy of the problem
// at that price, and the cap-priced T is the copy-based formula of session 29 to the bit.
TEST(WsaPrefillPrice, StepAtAPriceIsTheProblemAtThatPrice) {
  std::mt19937 rng(30);
  std::uniform_real_distribution<double> u(0, 1);
  auto curve = [&](std::mt19937& g, int n, bool) {
    std::vector<double> y(std::size_t(n) + 1);
    y[std::size_t(n)] = u(g);
    for (int i = n - 1; i >= 0; --i) y[std::size_t(i)] = y[std::size_t(i) + 1] + u(g) * u(g) * 4;
    return y;
  };
  int checked = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int L = 1 + static_cast<int>(rng() % 3), E = 4 + static_cast<int>(rng() % 12);
    SplitProblem p = testing::random_problem(rng, L, E, 10 + static_cast<int>(rng() % 60),
                                             trial % 2 == 0, false, curve);
    p.kv_prefix_misses = curve(rng, p.kv_max_blocks(), false);
    p.prefix_block_cost_s = 1e-3 * (0.5 + 2 * u(rng));
    for (int l = 0; l < L; ++l) p.recompute_misses.push_back(curve(rng, E, false));
    p.prefix_block_base_s = 1e-4 * u(rng);
    p.prefix_misses_seen = u(rng);
    for (const Split& s : all_uniform_splits(p)) {
      SplitProblem q = p;
      q.prefix_block_cost_s = prefix_block_cost_at(p, s);
      EXPECT_EQ(modelled_step_s(p, s, q.prefix_block_cost_s), modelled_step_s(q, s));
      EXPECT_EQ(kv_side_s(p, s.kv_blocks, q.prefix_block_cost_s), kv_side_s(q, s.kv_blocks));
      EXPECT_EQ(modelled_step_priced_by_caps_s(p, s),
                modelled_step_s(q, s) -
                    p.prefix_misses_seen * (q.prefix_block_cost_s - p.prefix_block_cost_s));
      EXPECT_EQ(modelled_step_s(p, s, p.prefix_block_cost_s), modelled_step_s(p, s));
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace ferry::serve::wsa
