// SPDX-License-Identifier: Apache-2.0
// Prompt scoring (GenerationRequest::prompt_logprobs) on the CUDA engine (label gpu; skips without
// a device). Written in session 26 without a GPU: not yet run.
//   - f32 dense weights: every prompt token's logprob against log_softmax of transformers' logits
//     (the HF fixtures). Bound: the CUDA engine's logits are within 1e-4 x max|ref| of the CPU
//     engine's (ServeEngineCuda) and those within 1e-4 x max|ref| of HF's (runner_golden_test),
//     and a logprob moves by at most twice its row's largest logit error: 4e-4 x max|ref|.
//   - bf16 dense weights: more logits rows than the runner planned its lm_head for (max_running
//     2) go through the small-m kernel in groups of 4 rows where the widening workspace (sized
//     for the largest other linear) cannot hold the lm_head (model_runner_cuda.cpp dense_gemm;
//     before session 26 that aborted), else through the widened weight. Against an engine whose
//     plan widens the lm_head (max_running 8): both are f32-accumulated products of the same bf16
//     weights, different summation orders only, held to 1e-4 x max|ref|.
#include <algorithm>
#include <cmath>

#include "serve/engine.h"
#include "tests/gpu/gpu_test_util.h"
#include "unit/serve/serve_test_util.h"

namespace ferry::serve {
namespace {

using ferry::testing::CudaTest;

class ServeLogprobsCuda : public CudaTest, public ::testing::WithParamInterface<const char*> {};

Result<RequestOutput> score(const model::LoadedModel& m, const std::vector<std::int32_t>& prompt,
                            EngineConfig cfg, kernels::Backend& be) {
  FERRY_ASSIGN_OR_RETURN(auto e, Engine::create(m.geometry, m.params, cfg, be));
  GenerationRequest g;
  g.prompt = prompt;
  g.max_new_tokens = 0;
  g.prompt_logprobs = 2;
  FERRY_ASSIGN_OR_RETURN(RequestId id, e->submit(std::move(g)));
  FERRY_TRY(e->run_until_idle());
  return e->take_output(id);
}

double ref_logprob(const float* row, std::int64_t V, std::int32_t t) {
  double mx = -INFINITY, sum = 0;
  for (std::int64_t j = 0; j < V; ++j) mx = std::max(mx, double(row[j]));
  for (std::int64_t j = 0; j < V; ++j) sum += std::exp(double(row[j]) - mx);
  return double(row[t]) - mx - std::log(sum);
}

TEST_P(ServeLogprobsCuda, PromptScoringMatchesTransformersAndBothLmHeadPaths) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model && f.expected);
  const auto ids = f.i32("input_ids"), cu = f.i32("cu_seqlens");
  const auto logits = f.f32("logits");
  const std::int64_t V = f.model->geometry.vocab, P = cu[1] - cu[0];
  double max_ref = 0;
  for (const float x : logits) max_ref = std::max(max_ref, std::fabs(double(x)));
  const std::vector<std::int32_t> prompt(ids.begin(), ids.begin() + P);
  EngineConfig cfg;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  auto f32 = score(*f.model, prompt, cfg, cuda());
  ASSERT_TRUE(f32.ok()) << f32.status().to_string();
  ASSERT_EQ(f32->prompt_logprobs.size(), std::size_t(P - 1));
  for (std::int64_t p = 0; p + 1 < P; ++p) {
    const TokenLogprob& lp = f32->prompt_logprobs[std::size_t(p)];
    EXPECT_NEAR(lp.logprob, ref_logprob(logits.data() + p * V, V, lp.token), 4e-4 * max_ref)
        << GetParam() << " position " << p;
  }
  EngineConfig bf16 = cfg;
  bf16.dense_dtype = DType::kBF16;
  bf16.max_running = 2;  // lm_head planned for <= 4 rows: the prompt's rows take the groups of 4
  EngineConfig wide = bf16;
  wide.max_running = 8;  // lm_head planned for 8 rows: widened and through cuBLAS
  auto a = score(*f.model, prompt, bf16, cuda());
  auto b = score(*f.model, prompt, wide, cuda());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_EQ(a->prompt_logprobs.size(), b->prompt_logprobs.size());
  for (std::size_t i = 0; i < a->prompt_logprobs.size(); ++i) {
    EXPECT_NEAR(a->prompt_logprobs[i].logprob, b->prompt_logprobs[i].logprob, 1e-4 * max_ref)
        << GetParam() << " position " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ServeLogprobsCuda,
                         ::testing::Values("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral",
                                           "olmoe"));

}  // namespace
}  // namespace ferry::serve
