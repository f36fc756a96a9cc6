// SPDX-License-Identifier: Apache-2.0
// The engine against transformers (tests/data/models/<arch>, fp64 reference stored as f32), for
// every architecture, dense and MoE. Criterion as in tests/golden: max |err| / max |ref| <= 1e-4.
//   - prefill: the fixture's 3 packed sequences as one step;
//   - chunked prefill: the same, 5 tokens per step (later chunks read earlier ones from the cache);
//   - decode: one token per step through the KV cache, each row against HF's full forward of the
//     longer sequence;
//   - greedy: the engine's greedy continuation equals transformers' generate() (fixture ids);
//   - optional longer greedy runs from tools/fixtures/make_generate_fixtures.py (skips if absent).
#include <cmath>
#include <filesystem>

#include "serve/model_runner.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

using testing::Fixture;
using testing::load_fixture;

const char* const kArchs[] = {"llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "olmoe"};

double rel_err(const std::vector<float>& got, const float* want, std::size_t n) {
  double max_ref = 0, max_err = 0;
  for (std::size_t i = 0; i < n; ++i) {
    max_ref = std::max(max_ref, std::fabs(double(want[i])));
    max_err = std::max(max_err, std::fabs(double(got[i]) - want[i]));
  }
  return max_err / max_ref;
}

// Runs the fixture's sequences through a bare runner, `chunk` tokens of each sequence per step
// (all sequences advance together), and returns logits of every token in packed order.
std::vector<float> runner_logits(const Fixture& f, std::int64_t chunk, ExpertMode mode) {
  const auto& geo = f.model->geometry;
  const auto ids = f.i32("input_ids"), cu = f.i32("cu_seqlens");
  const int S = static_cast<int>(cu.size()) - 1;
  auto kv = KvCache::create(geo, {.block_tokens = 4, .budget_bytes = 4 << 20});
  EXPECT_TRUE(kv.ok()) << kv.status().to_string();
  auto ex = ExpertExecutor::create(geo, f.model->params, {.mode = mode, .slots_per_layer = 0});
  EXPECT_TRUE(ex.ok()) << ex.status().to_string();
  auto runner = ModelRunner::create(geo, f.model->params, **kv, **ex, 64, kernels::cpu_backend());
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  std::vector<BlockTable> tables(S);
  for (int s = 0; s < S; ++s) EXPECT_TRUE((*kv)->reserve(tables[s], cu[s + 1] - cu[s]).ok());
  std::vector<float> logits(ids.size() * geo.vocab);
  std::vector<float> step_logits(64 * geo.vocab);
  for (std::int64_t start = 0;; start += chunk) {
    StepBatch b;
    std::vector<std::int64_t> rows;  // packed index of each batch row
    for (int s = 0; s < S; ++s) {
      b.tables.push_back(&tables[s]);
      b.requests.push_back(s);
      for (std::int64_t p = start; p < std::min<std::int64_t>(start + chunk, cu[s + 1] - cu[s]);
           ++p) {
        b.logit_rows.push_back(static_cast<std::int32_t>(b.ids.size()));
        b.ids.push_back(ids[cu[s] + p]);
        b.positions.push_back(static_cast<std::int32_t>(p));
        b.seq_of.push_back(s);
        rows.push_back(cu[s] + p);
      }
    }
    if (b.ids.empty()) break;
    const Status st = (*runner)->forward(b, step_logits.data());
    EXPECT_TRUE(st.ok()) << st.to_string();
    for (std::size_t r = 0; r < rows.size(); ++r) {
      std::copy_n(step_logits.data() + r * geo.vocab, geo.vocab,
                  logits.data() + rows[r] * geo.vocab);
    }
  }
  return logits;
}

class RunnerGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(RunnerGolden, PrefillMatchesTransformers) {
  const Fixture f = load_fixture(GetParam());
  ASSERT_TRUE(f.model && f.expected);
  const auto want = f.f32("logits");
  const auto got = runner_logits(f, 64, ExpertMode::kResident);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LE(rel_err(got, want.data(), want.size()), 1e-4) << GetParam();
}

TEST_P(RunnerGolden, ChunkedPrefillMatchesTransformers) {
  const Fixture f = load_fixture(GetParam());
  ASSERT_TRUE(f.model && f.expected);
  const auto want = f.f32("logits");
  const auto got = runner_logits(f, 5, ExpertMode::kResident);
  EXPECT_LE(rel_err(got, want.data(), want.size()), 1e-4) << GetParam();
}

TEST_P(RunnerGolden, TokenByTokenDecodeMatchesFullForward) {
  const Fixture f = load_fixture(GetParam());
  ASSERT_TRUE(f.model && f.expected);
  const auto want = f.f32("logits");
  const auto got = runner_logits(f, 1, ExpertMode::kResident);
  EXPECT_LE(rel_err(got, want.data(), want.size()), 1e-4) << GetParam();
}

TEST_P(RunnerGolden, GreedyEqualsTransformersGenerate) {
  const Fixture f = load_fixture(GetParam());
  ASSERT_TRUE(f.model && f.expected);
  const auto prompt = f.i32("greedy_prompt"), want = f.i32("greedy_output");
  for (ExpertMode mode : {ExpertMode::kResident, ExpertMode::kPaged}) {
    EngineConfig cfg;
    cfg.pager.mode = mode;
    cfg.pager.slots_per_layer = f.model->geometry.top_k;  // the tightest cap (ignored if dense)
    cfg.max_batch_tokens = 4;                             // chunked prefill
    cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
    auto eng = Engine::create(f.model->geometry, f.model->params, cfg);
    ASSERT_TRUE(eng.ok()) << eng.status().to_string();
    auto rec = testing::run_engine(
        **eng, {{.prompt = prompt, .max_new_tokens = static_cast<int>(want.size())}});
    ASSERT_TRUE(rec.ok()) << rec.status().to_string();
    EXPECT_EQ(rec->tokens.at(0), want) << GetParam() << " mode " << to_string(mode);
  }
}

// Longer greedy runs written by tools/fixtures/make_generate_fixtures.py on the GPU machine:
// tests/data/serve/generate/<arch>.safetensors with prompt_<i>, output_<i> (i32), margin_<i> (f32).
TEST_P(RunnerGolden, LongGreedyEqualsTransformersGenerate) {
  const std::string path =
      std::string(FERRY_TEST_DATA_DIR) + "/serve/generate/" + GetParam() + ".safetensors";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << "no " << path
                 << " yet: run python3 tools/fixtures/make_generate_fixtures.py on the GPU "
                    "machine (transformers) and commit its output";
  }
  const Fixture f = load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  auto gen = model::SafetensorsFile::open(path);
  ASSERT_TRUE(gen.ok()) << gen.status().to_string();
  testing::Fixture g;
  g.expected = std::make_unique<model::SafetensorsFile>(std::move(*gen));
  int compared = 0;
  for (int i = 0;; ++i) {
    if (!g.expected->view("prompt_" + std::to_string(i)).ok()) break;
    const auto prompt = g.i32("prompt_" + std::to_string(i));
    const auto want = g.i32("output_" + std::to_string(i));
    EngineConfig cfg;
    cfg.max_batch_tokens = 8;
    cfg.kv = {.block_tokens = 8, .budget_bytes = 4 << 20};
    auto eng = Engine::create(f.model->geometry, f.model->params, cfg);
    ASSERT_TRUE(eng.ok()) << eng.status().to_string();
    auto rec = testing::run_engine(
        **eng, {{.prompt = prompt, .max_new_tokens = static_cast<int>(want.size())}});
    ASSERT_TRUE(rec.ok()) << rec.status().to_string();
    // Compare up to the first near-tie of HF's top-2 logits (margin < 1e-4, within f32 noise):
    // from there the two greedy paths may legitimately part.
    const auto margin = g.f32("margin_" + std::to_string(i));
    std::size_t n = want.size();
    for (std::size_t j = 0; j < margin.size() && j < n; ++j) {
      if (margin[j] < 1e-4f) n = j;
    }
    const auto& got = rec->tokens.at(0);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::vector<std::int32_t>(got.begin(), got.begin() + n),
              std::vector<std::int32_t>(want.begin(), want.begin() + n))
        << GetParam() << " prompt " << i << " (compared " << n << " of " << want.size() << ")";
    ++compared;
  }
  EXPECT_GT(compared, 0) << path << " holds no prompt_0";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RunnerGolden, ::testing::ValuesIn(kArchs),
                         [](const auto& pi) { return std::string(pi.param); });

}  // namespace
}  // namespace ferry::serve
