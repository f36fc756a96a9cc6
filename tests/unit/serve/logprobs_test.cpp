// SPDX-License-Identifier: Apache-2.0
// Log-probabilities (serve/logprobs.h and the engine's logprobs / prompt_logprobs):
//   - token_logprob against a plain long-double log-softmax, top-n against a full sort;
//   - the engine's prompt and generated logprobs against transformers' logits (the HF fixtures,
//     tests/data/models/<arch>), for every architecture: the engine's logits are within 1e-4 x
//     max|ref| of HF's (runner_golden_test), and a logprob x_t - lse moves by at most twice the
//     largest logit error (|d x_t| + |d lse| <= 2 max |d x|), so the bound here is 2e-4 x max|ref|;
//   - scoring only (max_new_tokens 0), chunked prefill, the prefix cache and concurrent requests
//     give the same prompt logprobs (bitwise with batch_invariant).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "serve/logprobs.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

using testing::Fixture;
using testing::load_fixture;

long double naive_logprob(const std::vector<float>& x, int t) {
  long double sum = 0;
  for (const float v : x) sum += std::exp(static_cast<long double>(v));
  return static_cast<long double>(x[std::size_t(t)]) - std::log(sum);
}

TEST(Logprobs, EqualANaiveLogSoftmaxAndAFullSort) {
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  LogprobScratch scratch;
  for (int V : {1, 5, 1000, 4099}) {
    std::vector<float> x(static_cast<std::size_t>(V));
    for (float& v : x) v = nd(gen);
    if (V > 10) x[3] = x[9] = x[V - 1] = 4.5f;  // ties: lower id first
    for (int n : {0, 1, 3, kMaxTopLogprobs}) {
      const int t = V / 2;
      const TokenLogprob lp = token_logprob(x, t, n, scratch);
      EXPECT_EQ(lp.token, t);
      const long double ref = naive_logprob(x, t);
      EXPECT_NEAR(lp.logprob, double(ref), 1e-6 * std::max(1.0, std::fabs(double(ref))));
      std::vector<int> order(static_cast<std::size_t>(V));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return x[std::size_t(a)] > x[std::size_t(b)]; });
      ASSERT_EQ(lp.top.size(), std::size_t(std::min(n, V)));
      for (std::size_t i = 0; i < lp.top.size(); ++i) {
        EXPECT_EQ(lp.top[i].first, order[i]) << "V " << V << " n " << n << " rank " << i;
        const long double r = naive_logprob(x, order[i]);
        EXPECT_NEAR(lp.top[i].second, double(r), 1e-6 * std::max(1.0, std::fabs(double(r))));
      }
    }
  }
  // A row with -inf entries (masked): finite for the others, -inf for the masked token.
  std::vector<float> m = {1.0f, -INFINITY, 2.0f};
  const TokenLogprob lp = token_logprob(m, 1, 3, scratch);
  EXPECT_TRUE(std::isinf(lp.logprob) && lp.logprob < 0);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 2);
  EXPECT_NEAR(std::exp(double(lp.top[0].second)) + std::exp(double(lp.top[1].second)), 1.0, 1e-6);
}

class LogprobsGolden : public ::testing::TestWithParam<const char*> {};

// log_softmax of a reference row (f64) at token t.
double ref_logprob(const float* row, std::int64_t V, std::int32_t t) {
  double mx = -INFINITY, sum = 0;
  for (std::int64_t j = 0; j < V; ++j) mx = std::max(mx, double(row[j]));
  for (std::int64_t j = 0; j < V; ++j) sum += std::exp(double(row[j]) - mx);
  return double(row[t]) - mx - std::log(sum);
}

RequestOutput run_one(const Fixture& f, const GenerationRequest& g, EngineConfig ec) {
  auto e = Engine::create(f.model->geometry, f.model->params, ec);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  auto id = (*e)->submit(g);
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  EXPECT_TRUE((*e)->run_until_idle().ok());
  auto out = (*e)->take_output(*id);
  EXPECT_TRUE(out.ok());
  return out.ok() ? *out : RequestOutput{};
}

TEST_P(LogprobsGolden, PromptAndGeneratedLogprobsMatchTransformers) {
  const Fixture f = load_fixture(GetParam());
  ASSERT_TRUE(f.model && f.expected);
  const auto ids = f.i32("input_ids"), cu = f.i32("cu_seqlens");
  const auto logits = f.f32("logits");
  const std::int64_t V = f.model->geometry.vocab;
  // The fixture's first sequence: its last token's row scores the first generated token.
  const std::int64_t P = cu[1] - cu[0];
  ASSERT_GE(P, 3);
  double max_ref = 0;  // over all the fixture's logits, as runner_golden_test's 1e-4 criterion
  for (const float x : logits) max_ref = std::max(max_ref, std::fabs(double(x)));
  const double tol = 2e-4 * max_ref;
  GenerationRequest g;
  g.prompt.assign(ids.begin(), ids.begin() + P);
  g.max_new_tokens = 1;
  g.logprobs = 4;
  g.prompt_logprobs = 4;
  EngineConfig ec;
  ec.kv.block_tokens = 4;
  const RequestOutput out = run_one(f, g, ec);
  ASSERT_EQ(out.prompt_logprobs.size(), std::size_t(P - 1));
  for (std::int64_t p = 0; p + 1 < P; ++p) {
    const float* row = logits.data() + p * V;
    const TokenLogprob& lp = out.prompt_logprobs[std::size_t(p)];
    EXPECT_EQ(lp.token, g.prompt[std::size_t(p + 1)]);
    EXPECT_NEAR(lp.logprob, ref_logprob(row, V, lp.token), tol) << "position " << p;
    ASSERT_EQ(lp.top.size(), 4u);
    for (const auto& [id, x] : lp.top) EXPECT_NEAR(x, ref_logprob(row, V, id), tol) << p;
    // The top entries are HF's most likely tokens wherever HF's order is not a near tie.
    std::vector<std::int32_t> order(static_cast<std::size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] > row[b]; });
    for (std::size_t k = 0; k < 4; ++k) {
      const bool clear = (k == 0 || row[order[k - 1]] - row[order[k]] > 2 * tol) &&
                         row[order[k]] - row[order[k + 1]] > 2 * tol;
      if (clear) {
        EXPECT_EQ(lp.top[k].first, order[k]) << "position " << p << " rank " << k;
      }
    }
  }
  ASSERT_EQ(out.tokens.size(), 1u);
  ASSERT_EQ(out.logprobs.size(), 1u);
  EXPECT_EQ(out.logprobs[0].token, out.tokens[0]);
  EXPECT_NEAR(out.logprobs[0].logprob, ref_logprob(logits.data() + (P - 1) * V, V, out.tokens[0]),
              tol);

  // Scoring only: finishes unsampled with the same prompt logprobs (within the bound: its last
  // step computes one logits row less, which may change the lm_head GEMM's blocking).
  GenerationRequest score = g;
  score.max_new_tokens = 0;
  const RequestOutput s = run_one(f, score, ec);
  EXPECT_EQ(s.finish, FinishReason::kLength);
  EXPECT_TRUE(s.tokens.empty() && s.logprobs.empty());
  ASSERT_EQ(s.prompt_logprobs.size(), out.prompt_logprobs.size());
  for (std::size_t i = 0; i < s.prompt_logprobs.size(); ++i) {
    EXPECT_NEAR(s.prompt_logprobs[i].logprob, out.prompt_logprobs[i].logprob, tol) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, LogprobsGolden,
                         ::testing::Values("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral",
                                           "olmoe"));

// Chunked prefill, a warm prefix cache and concurrent requests do not change the prompt's
// logprobs (batch_invariant: bitwise), and each request scores every prompt token once.
TEST(LogprobsEngine, ChunksPrefixCacheAndConcurrencyGiveTheSameBits) {
  const Fixture f = load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const auto ids = f.i32("input_ids"), cu = f.i32("cu_seqlens");
  GenerationRequest g;
  g.prompt.assign(ids.begin() + cu[0], ids.begin() + cu[1]);
  g.max_new_tokens = 3;
  g.logprobs = 2;
  g.prompt_logprobs = 2;
  EngineConfig base;
  base.batch_invariant = true;
  base.kv.block_tokens = 4;
  const RequestOutput solo = run_one(f, g, base);
  ASSERT_EQ(solo.prompt_logprobs.size(), g.prompt.size() - 1);
  auto same = [&](const RequestOutput& o, const char* what) {
    ASSERT_EQ(o.prompt_logprobs.size(), solo.prompt_logprobs.size()) << what;
    for (std::size_t i = 0; i < o.prompt_logprobs.size(); ++i) {
      EXPECT_EQ(o.prompt_logprobs[i].logprob, solo.prompt_logprobs[i].logprob) << what << " " << i;
      EXPECT_EQ(o.prompt_logprobs[i].top, solo.prompt_logprobs[i].top) << what << " " << i;
    }
    EXPECT_EQ(o.tokens, solo.tokens) << what;
    ASSERT_EQ(o.logprobs.size(), solo.logprobs.size()) << what;
    for (std::size_t i = 0; i < o.logprobs.size(); ++i) {
      EXPECT_EQ(o.logprobs[i].logprob, solo.logprobs[i].logprob) << what << " " << i;
    }
  };
  EngineConfig chunked = base;
  chunked.max_batch_tokens = 3;
  chunked.max_running = 2;
  same(run_one(f, g, chunked), "chunked prefill");

  // A prefix cache warmed by the same prompt: the scoring request still computes (and scores)
  // every position; a plain request after it does hit the cache.
  EngineConfig cached = base;
  cached.kv.prefix_cache = true;
  auto e = Engine::create(f.model->geometry, f.model->params, cached);
  ASSERT_TRUE(e.ok());
  GenerationRequest plain = g;
  plain.logprobs = plain.prompt_logprobs = -1;
  auto warm = (*e)->submit(plain);
  ASSERT_TRUE(warm.ok());
  ASSERT_TRUE((*e)->run_until_idle().ok());
  const std::uint64_t hits_before = (*e)->stats().prefix_hit_tokens;
  // Two at once: the scoring request and another plain one, batched together.
  auto a = (*e)->submit(g);
  auto b = (*e)->submit(plain);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*e)->run_until_idle().ok());
  EXPECT_GT((*e)->stats().prefix_hit_tokens, hits_before);  // the plain one matched
  auto out = (*e)->take_output(*a);
  ASSERT_TRUE(out.ok());
  same(*out, "prefix cache + concurrent");
}

// A long prompt's scoring rows in one step go to the thread pool (16 rows or more); in steps of
// at most 5 rows they are scored on the engine's thread. Same bits, every position once, in order.
TEST(LogprobsEngine, PooledScoringEqualsScoringOnTheEngineThread) {
  const Fixture f = load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const auto ids = f.i32("input_ids");
  GenerationRequest g;
  for (std::size_t i = 0; g.prompt.size() < 96; ++i) g.prompt.push_back(ids[i % ids.size()]);
  g.max_new_tokens = 0;
  g.prompt_logprobs = 3;
  EngineConfig whole;
  whole.batch_invariant = true;
  whole.max_batch_tokens = 128;  // the whole prompt in one step: 95 rows on the pool
  EngineConfig small = whole;
  small.max_batch_tokens = 5;
  const RequestOutput pooled = run_one(f, g, whole);
  const RequestOutput serial = run_one(f, g, small);
  ASSERT_EQ(pooled.prompt_logprobs.size(), g.prompt.size() - 1);
  ASSERT_EQ(serial.prompt_logprobs.size(), g.prompt.size() - 1);
  for (std::size_t i = 0; i < pooled.prompt_logprobs.size(); ++i) {
    EXPECT_EQ(pooled.prompt_logprobs[i].token, g.prompt[i + 1]) << i;
    EXPECT_EQ(pooled.prompt_logprobs[i].logprob, serial.prompt_logprobs[i].logprob) << i;
    EXPECT_EQ(pooled.prompt_logprobs[i].top, serial.prompt_logprobs[i].top) << i;
  }
}

// 16 sampled sequences decoding together (their rows computed on the thread pool: 16 rows) give
// each one the tokens and logprobs it gets alone (one row per step, on the engine's thread):
// seeded sampling with penalties, top-k / top-p / min-p, logprobs with alternatives.
TEST(LogprobsEngine, PooledSamplingEqualsEachSequenceAlone) {
  const Fixture f = load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const auto ids = f.i32("input_ids");
  EngineConfig together;
  together.batch_invariant = true;
  together.max_running = 16;
  together.max_batch_tokens = 256;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 16; ++i) {
    GenerationRequest g;
    for (int k = 0; k < 5 + i; ++k) g.prompt.push_back(ids[std::size_t(k * 7 + i) % ids.size()]);
    g.max_new_tokens = 6;
    g.sampling = {.temperature = 0.7f + 0.05f * float(i % 4),
                  .top_k = i % 3 == 0 ? 20 : 0,
                  .top_p = i % 2 == 0 ? 0.9f : 1.0f,
                  .min_p = i % 5 == 0 ? 0.05f : 0.0f,
                  .seed = std::uint64_t(100 + i)};
    if (i % 4 == 1) g.sampling.penalties = {.repetition = 1.3f, .presence = 0.4f};
    g.logprobs = 2;
    reqs.push_back(std::move(g));
  }
  auto e = Engine::create(f.model->geometry, f.model->params, together);
  ASSERT_TRUE(e.ok());
  std::vector<RequestId> got;
  for (const auto& g : reqs) {
    auto id = (*e)->submit(g);
    ASSERT_TRUE(id.ok());
    got.push_back(*id);
  }
  ASSERT_TRUE((*e)->run_until_idle().ok());
  EngineConfig alone = together;
  alone.max_running = 1;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto out = (*e)->take_output(got[i]);
    ASSERT_TRUE(out.ok());
    const RequestOutput ref = run_one(f, reqs[i], alone);
    EXPECT_EQ(out->tokens, ref.tokens) << "sequence " << i;
    ASSERT_EQ(out->logprobs.size(), ref.logprobs.size()) << i;
    for (std::size_t t = 0; t < ref.logprobs.size(); ++t) {
      EXPECT_EQ(out->logprobs[t].logprob, ref.logprobs[t].logprob) << i << " " << t;
      EXPECT_EQ(out->logprobs[t].top, ref.logprobs[t].top) << i << " " << t;
    }
  }
}

TEST(LogprobsEngine, BadCountsAreRefused) {
  const Fixture f = load_fixture("qwen3");
  ASSERT_TRUE(f.model);
  auto e = Engine::create(f.model->geometry, f.model->params, EngineConfig{});
  ASSERT_TRUE(e.ok());
  GenerationRequest g;
  g.prompt = {1, 2, 3};
  g.logprobs = kMaxTopLogprobs + 1;
  EXPECT_EQ((*e)->submit(g).status().code(), StatusCode::kInvalidArgument);
  g.logprobs = -1;
  g.prompt_logprobs = -2;
  EXPECT_EQ((*e)->submit(g).status().code(), StatusCode::kInvalidArgument);
  g.prompt_logprobs = -1;
  g.max_new_tokens = 0;  // generating nothing is only for scoring
  EXPECT_EQ((*e)->submit(g).status().code(), StatusCode::kInvalidArgument);
  g.prompt_logprobs = 0;
  EXPECT_TRUE((*e)->submit(g).ok());
}

}  // namespace
}  // namespace ferry::serve
