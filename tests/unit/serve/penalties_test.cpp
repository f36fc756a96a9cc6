// SPDX-License-Identifier: Apache-2.0
// Repetition / presence / frequency penalties (serve/logit_penalties.h): the in-place kernel
// against a plain map-based twin, and the engine's greedy tokens against argmax of the twin
// applied to the raw rows the engine sampled from (its logits observer).
#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "serve/logit_penalties.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

// The twin: the formulas of logit_penalties.h written out with std::set / std::map.
std::vector<float> penalized(std::vector<float> row, const PenaltyParams& p,
                             const std::vector<std::int32_t>& prompt,
                             const std::vector<std::int32_t>& generated) {
  if (p.repetition != 1.0f) {
    std::set<std::int32_t> seen(prompt.begin(), prompt.end());
    seen.insert(generated.begin(), generated.end());
    for (const std::int32_t t : seen) {
      float& x = row[std::size_t(t)];
      x = x > 0.0f ? x / p.repetition : x * p.repetition;
    }
  }
  std::map<std::int32_t, int> count;
  for (const std::int32_t t : generated) ++count[t];
  for (const auto& [t, c] : count) {
    row[std::size_t(t)] -= p.presence + p.frequency * static_cast<float>(c);
  }
  for (const auto& [t, b] : p.logit_bias) row[std::size_t(t)] += b;
  return row;
}

TEST(Penalties, EqualTheTwinAndLeaveTheScratchClean) {
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  PenaltyScratch scratch;
  const int V = 300;
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<float> row(static_cast<std::size_t>(V));
    for (float& x : row) x = nd(gen);
    std::uniform_int_distribution<int> tok(0, trial % 2 ? 20 : V - 1);  // many repeats or few
    std::vector<std::int32_t> prompt(std::size_t(1 + trial % 7)), out(std::size_t(trial % 11));
    for (auto& t : prompt) t = tok(gen);
    for (auto& t : out) t = tok(gen);
    PenaltyParams p{.repetition = trial % 3 == 0 ? 1.0f : 1.3f,
                    .presence = trial % 4 == 1 ? 0.0f : 0.7f,
                    .frequency = trial % 5 == 2 ? 0.0f : -0.4f};
    if (trial % 2 == 0) p.logit_bias = {{std::int32_t(trial), -5.0f}, {3, 2.5f}};
    ASSERT_TRUE(validate(p, V).ok());
    std::vector<float> got = row;
    apply_penalties(got, p, prompt, out, scratch);
    EXPECT_EQ(got, penalized(row, p, prompt, out)) << "trial " << trial;
    for (const std::int32_t c : scratch.count) ASSERT_EQ(c, 0);
    for (const std::uint8_t s : scratch.seen) ASSERT_EQ(s, 0);
  }
  // Off: the row is untouched.
  std::vector<float> row = {1.0f, -2.0f, 3.0f};
  apply_penalties(row, PenaltyParams{}, std::vector<std::int32_t>{0, 1},
                  std::vector<std::int32_t>{2, 2}, scratch);
  EXPECT_EQ(row, (std::vector<float>{1.0f, -2.0f, 3.0f}));
  EXPECT_FALSE(validate(PenaltyParams{.repetition = 0.0f}, V).ok());
  EXPECT_FALSE(validate(PenaltyParams{.presence = 2.5f}, V).ok());
  EXPECT_FALSE(validate(PenaltyParams{.frequency = -3.0f}, V).ok());
  EXPECT_FALSE(validate(PenaltyParams{.logit_bias = {{V, 1.0f}}}, V).ok());
  EXPECT_FALSE(validate(PenaltyParams{.logit_bias = {{1, 101.0f}}}, V).ok());
  EXPECT_FALSE(validate(PenaltyParams{.logit_bias = {{1, 1.0f}, {1, 2.0f}}}, V).ok());
  EXPECT_TRUE(
      validate(PenaltyParams{.repetition = 1.2f, .presence = -2.0f, .frequency = 2.0f}, V).ok());
}

TEST(Penalties, EngineGreedyIsArgmaxOfThePenalizedRawRow) {
  auto m = testing::tiny_builtin_moe(3);
  ASSERT_TRUE(m);
  const int V = static_cast<int>(m->geometry.vocab);
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 9; ++i) prompt.push_back((i * 7 + 3) % V);
  auto run = [&](const PenaltyParams& p, std::vector<std::vector<float>>* rows) {
    auto e = Engine::create(m->geometry, m->params, EngineConfig{});
    EXPECT_TRUE(e.ok());
    if (rows) {
      (*e)->set_logits_observer([rows](RequestId, int, std::span<const float> r) {
        rows->emplace_back(r.begin(), r.end());
      });
    }
    GenerationRequest g;
    g.prompt = prompt;
    g.max_new_tokens = 24;
    g.sampling.penalties = p;
    g.logprobs = 0;
    auto id = (*e)->submit(std::move(g));
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    EXPECT_TRUE((*e)->run_until_idle().ok());
    auto out = (*e)->take_output(*id);
    EXPECT_TRUE(out.ok());
    return *out;
  };
  const PenaltyParams p{.repetition = 2.0f, .presence = 0.5f, .frequency = 1.5f};
  std::vector<std::vector<float>> rows;
  const RequestOutput out = run(p, &rows);
  ASSERT_EQ(rows.size(), out.tokens.size());
  for (std::size_t k = 0; k < out.tokens.size(); ++k) {
    const std::vector<std::int32_t> before(out.tokens.begin(), out.tokens.begin() + k);
    const std::vector<float> twin = penalized(rows[k], p, prompt, before);
    EXPECT_EQ(out.tokens[k], argmax(twin)) << "token " << k;
    // logprobs stay the raw row's.
    LogprobScratch ls;
    EXPECT_EQ(out.logprobs[k].logprob, token_logprob(rows[k], out.tokens[k], 0, ls).logprob);
  }
  // The penalties changed the answer (the unpenalized greedy run repeats itself).
  const RequestOutput plain = run(PenaltyParams{}, nullptr);
  EXPECT_NE(plain.tokens, out.tokens);
  // A logit bias of +100 on a token the plain run never picks forces it at every step; -100 on
  // the plain run's first token removes it from the answer.
  std::int32_t unused = 0;
  while (std::find(plain.tokens.begin(), plain.tokens.end(), unused) != plain.tokens.end())
    ++unused;
  const RequestOutput forced = run(PenaltyParams{.logit_bias = {{unused, 100.0f}}}, nullptr);
  EXPECT_EQ(forced.tokens, std::vector<std::int32_t>(forced.tokens.size(), unused));
  const RequestOutput banned =
      run(PenaltyParams{.logit_bias = {{plain.tokens[0], -100.0f}}}, nullptr);
  EXPECT_EQ(std::find(banned.tokens.begin(), banned.tokens.end(), plain.tokens[0]),
            banned.tokens.end());
  // Out-of-range values are refused at submit.
  auto e = Engine::create(m->geometry, m->params, EngineConfig{});
  ASSERT_TRUE(e.ok());
  GenerationRequest bad;
  bad.prompt = prompt;
  bad.sampling.penalties.presence = 3.0f;
  EXPECT_EQ((*e)->submit(bad).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::serve
