// SPDX-License-Identifier: Apache-2.0
// The engine's request lifecycle on the built-in MoE: max new tokens, stop token ids, stop
// strings (through a detokenizer), cancellation (running and waiting), admission when the KV
// pool is short, bad input as Status, seeded sampling reproducible whatever shares the batch, and
// continuous batching agreeing with running each request alone.
#include <cmath>

#include "serve/builtin_model.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

std::unique_ptr<BuiltinModel> builtin() { return testing::tiny_builtin_moe(11); }

EngineConfig config(int running = 4) {
  EngineConfig cfg;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.pager.slots_per_layer = 3;
  cfg.max_batch_tokens = 16;
  cfg.max_running = running;
  cfg.kv = {.block_tokens = 8, .budget_bytes = 1 << 20};
  return cfg;
}

std::vector<std::int32_t> prompt(int n, int salt) {
  std::vector<std::int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 31 + salt * 7 + 3) % 256);
  return p;
}

// A toy detokenizer: each id becomes one character 'a' + id % 26.
Result<std::string> letters(std::span<const std::int32_t> ids) {
  std::string s;
  for (std::int32_t id : ids) s += static_cast<char>('a' + id % 26);
  return s;
}

TEST(Engine, StopsAtMaxNewTokensStopTokenAndStopString) {
  auto m = builtin();
  ASSERT_TRUE(m);
  auto eng = Engine::create(m->geometry, m->params, config());
  ASSERT_TRUE(eng.ok()) << eng.status().to_string();
  auto id = (*eng)->submit({.prompt = prompt(10, 1), .max_new_tokens = 12});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE((*eng)->run_until_idle().ok());
  auto full = (*eng)->take_output(*id);
  ASSERT_TRUE(full.ok());
  ASSERT_EQ(full->tokens.size(), 12u);
  EXPECT_EQ(full->finish, FinishReason::kLength);
  // Stop at the 5th generated token's id (greedy is deterministic, so it is generated again).
  const std::int32_t stop_id = full->tokens[4];
  const auto first = std::find(full->tokens.begin(), full->tokens.end(), stop_id);
  id = (*eng)->submit({.prompt = prompt(10, 1), .max_new_tokens = 12, .stop_token_ids = {stop_id}});
  ASSERT_TRUE((*eng)->run_until_idle().ok());
  auto stopped = (*eng)->take_output(*id);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->finish, FinishReason::kStopToken);
  EXPECT_EQ(stopped->tokens, std::vector<std::int32_t>(full->tokens.begin(), first + 1));
  // Stop string: the letters of generated tokens 3..4; the text is cut before it.
  const std::string text = *letters(full->tokens);
  const std::string stop = text.substr(3, 2);
  id = (*eng)->submit({.prompt = prompt(10, 1),
                       .max_new_tokens = 12,
                       .stop_strings = {stop},
                       .detokenize = letters});
  ASSERT_TRUE((*eng)->run_until_idle().ok());
  auto cut = (*eng)->take_output(*id);
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ(cut->finish, FinishReason::kStopString);
  EXPECT_EQ(cut->text, text.substr(0, text.find(stop)));
  EXPECT_LE(cut->tokens.size(), 5u);
}

TEST(Engine, CancelRunningAndWaitingRequests) {
  auto m = builtin();
  ASSERT_TRUE(m);
  auto eng = Engine::create(m->geometry, m->params, config(/*running=*/1));
  ASSERT_TRUE(eng.ok());
  Engine& e = **eng;
  auto a = e.submit({.prompt = prompt(5, 1), .max_new_tokens = 50});
  auto b = e.submit({.prompt = prompt(5, 2), .max_new_tokens = 50});
  ASSERT_TRUE(a.ok() && b.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(e.step().ok());
  ASSERT_TRUE(e.cancel(*b).ok());  // still waiting (max_running 1)
  ASSERT_TRUE(e.cancel(*a).ok());  // running
  auto ev = e.step();
  ASSERT_TRUE(ev.ok());
  int cancelled = 0;
  for (const TokenEvent& t : *ev) cancelled += t.finish == FinishReason::kCancelled;
  EXPECT_EQ(cancelled, 2);
  EXPECT_TRUE(e.idle());
  EXPECT_EQ(e.kv().free_blocks(), e.kv().num_blocks()) << "cancelled request kept its blocks";
  auto out = e.take_output(*a);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->finish, FinishReason::kCancelled);
  EXPECT_EQ(out->tokens.size(), 3u);  // step 1: prompt + first token; steps 2, 3: one each
  EXPECT_FALSE(e.cancel(12345).ok());
}

TEST(Engine, WaitsForKvBlocksInsteadOfFailing) {
  auto m = builtin();
  ASSERT_TRUE(m);
  EngineConfig cfg = config();
  const std::size_t block = 2 * 2 * 8 * 2 * 16 * sizeof(float);  // L * KV * tokens * G * D
  cfg.kv.budget_bytes = 4 * block;                               // 32 positions
  auto eng = Engine::create(m->geometry, m->params, cfg);
  ASSERT_TRUE(eng.ok()) << eng.status().to_string();
  Engine& e = **eng;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 3; ++i) reqs.push_back({.prompt = prompt(10, i), .max_new_tokens = 6});
  int max_running_seen = 0;
  std::vector<RequestId> ids;
  for (auto& r : reqs) ids.push_back(*e.submit(r));
  while (!e.idle()) {
    ASSERT_TRUE(e.step().ok());
    max_running_seen = std::max(max_running_seen, e.stats().kv_blocks);
    EXPECT_LE(e.kv().budget().bytes_used(), e.kv().budget().bytes_limit());
  }
  EXPECT_LE(max_running_seen, 4);
  for (RequestId id : ids) EXPECT_EQ(e.take_output(id)->tokens.size(), 6u);
  // A request that can never fit is refused up front.
  auto big = e.submit({.prompt = prompt(30, 1), .max_new_tokens = 10});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
}

TEST(Engine, BadInputIsAStatus) {
  auto m = builtin();
  ASSERT_TRUE(m);
  auto eng = Engine::create(m->geometry, m->params, config());
  ASSERT_TRUE(eng.ok());
  EXPECT_EQ((*eng)->submit({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*eng)->submit({.prompt = {1, 999}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*eng)->submit({.prompt = {1}, .max_new_tokens = 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*eng)->submit({.prompt = {1}, .sampling = {.top_p = 2.0f}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*eng)->submit({.prompt = {1}, .stop_strings = {"x"}}).status().code(),
            StatusCode::kInvalidArgument);
  EngineConfig bad = config();
  bad.max_running = 32;
  bad.max_batch_tokens = 8;
  EXPECT_FALSE(Engine::create(m->geometry, m->params, bad).ok());
  bad = config();
  bad.pager.slots_per_layer = 1;  // < top-k
  auto e2 = Engine::create(m->geometry, m->params, bad);
  ASSERT_FALSE(e2.ok());
  EXPECT_EQ(e2.status().code(), StatusCode::kResourceExhausted);
}

TEST(Engine, UnseededRequestsDifferFromEachOtherButRepeatPerEngineRun) {
  auto m = builtin();
  ASSERT_TRUE(m);
  const GenerationRequest r{
      .prompt = prompt(6, 3), .sampling = {.temperature = 1.5f}, .max_new_tokens = 12};
  auto run = [&] {
    auto eng = Engine::create(m->geometry, m->params, config());
    EXPECT_TRUE(eng.ok());
    auto rec = testing::run_engine(**eng, {r, r});
    EXPECT_TRUE(rec.ok());
    return rec.ok() ? rec->tokens : std::map<RequestId, std::vector<std::int32_t>>{};
  };
  const auto a = run(), b = run();
  ASSERT_EQ(a.size(), 2u);
  EXPECT_NE(a.at(0), a.at(1)) << "two unseeded requests drew the same stream";
  EXPECT_EQ(a, b);
}

TEST(Engine, OneDeviceBudgetCoversKvAndExperts) {
  auto m = builtin();
  ASSERT_TRUE(m);
  for (ExpertMode mode : {ExpertMode::kPaged, ExpertMode::kStatic}) {
    EngineConfig cfg = config();
    cfg.pager.mode = mode;
    auto free_run = Engine::create(m->geometry, m->params, cfg);
    ASSERT_TRUE(free_run.ok());
    const std::size_t sum =
        (*free_run)->kv().budget().bytes_used() + (*free_run)->experts().device_bytes();
    EXPECT_GT((*free_run)->experts().device_bytes(), 0u);
    EXPECT_EQ((*free_run)->device_budget().bytes_peak(), sum);
    cfg.device_budget_bytes = sum;
    auto exact = Engine::create(m->geometry, m->params, cfg);
    ASSERT_TRUE(exact.ok()) << exact.status().to_string();
    ASSERT_TRUE(testing::run_engine(**exact, {{.prompt = prompt(9, 1), .max_new_tokens = 5}}).ok());
    EXPECT_LE((*exact)->device_budget().bytes_peak(), sum);
    cfg.device_budget_bytes = sum - 1;
    auto over = Engine::create(m->geometry, m->params, cfg);
    ASSERT_FALSE(over.ok());
    EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status().to_string();
  }
}

TEST(Engine, ContinuousBatchingAgreesWithRunningAlone) {
  auto m = builtin();
  ASSERT_TRUE(m);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    reqs.push_back({.prompt = prompt(5 + 4 * i, i), .max_new_tokens = 8});
  }
  reqs[3].sampling = {.temperature = 0.9f, .top_k = 40, .seed = 77};
  auto together = Engine::create(m->geometry, m->params, config());
  ASSERT_TRUE(together.ok());
  auto all = testing::run_engine(**together, reqs);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_GT((*together)->stats().steps, 0u);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    auto alone = Engine::create(m->geometry, m->params, config());
    ASSERT_TRUE(alone.ok());
    auto one = testing::run_engine(**alone, {reqs[i]});
    ASSERT_TRUE(one.ok());
    // Same tokens (the sampled request too: its Rng is its own), logits within f32 GEMM noise
    // (the dense GEMMs see a different number of rows).
    EXPECT_EQ(one->tokens.at(0), all->tokens.at(RequestId(i))) << "request " << i;
    const auto& a = one->logits.at(0);
    const auto& b = all->logits.at(RequestId(i));
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t r = 0; r < a.size(); ++r) {
      for (std::size_t v = 0; v < a[r].size(); ++v) {
        ASSERT_NEAR(a[r][v], b[r][v], 1e-4 * (1 + std::fabs(b[r][v]))) << i << " " << r;
      }
    }
  }
}

}  // namespace
}  // namespace ferry::serve
