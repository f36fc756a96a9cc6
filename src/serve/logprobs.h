// SPDX-License-Identifier: Apache-2.0
// Log-probabilities of tokens under one row of logits, for the API's `logprobs` / `top_logprobs`
// and `echo` (prompt) scoring (docs/serve.md "Log-probabilities").
//   logprob(t) = x_t - log(sum_j exp(x_j))   over the RAW logits (before temperature, top-k and
//   top-p: the model's distribution, as vLLM reports by default), max-shifted, summed in f64.
//   top: the `top_n` most likely tokens, descending, ties by lower id.
// Rows are full vocabularies (~150k floats): one pass for the max and sum, one partial selection
// for the top entries, no allocation in steady state (LogprobScratch is reused by the engine).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace ferry::serve {

// The most alternatives a request may ask for per position (OpenAI's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;

struct TokenLogprob {
  std::int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<std::int32_t, float>> top;  // (id, logprob), most likely first
};

struct LogprobScratch {
  std::vector<std::pair<float, std::int32_t>> heap;  // top-n selection
};

// log(sum_j exp(x_j)) in f64 (max-shifted). -inf for an empty row.
double log_sum_exp(std::span<const float> logits);

// The logprob of `token` (in [0, logits.size())) and the top_n (0..kMaxTopLogprobs) best tokens.
TokenLogprob token_logprob(std::span<const float> logits, std::int32_t token, int top_n,
                           LogprobScratch& scratch);

}  // namespace ferry::serve
