// SPDX-License-Identifier: Apache-2.0
// Repetition, presence and frequency penalties on one row of logits, applied before sampling
// (and before temperature / top-k / top-p; greedy decoding sees them too), as vLLM does:
//   repetition r (CTRL; transformers' RepetitionPenaltyLogitsProcessor): every token that occurs
//     in the prompt or the generated tokens gets x / r if x > 0, else x * r (r = 1: off);
//   presence p and frequency f (OpenAI): x_t -= p * [c_t > 0] + f * c_t, c_t the count of t among
//     the generated tokens only (p = f = 0: off);
//   logit_bias (OpenAI): x_t += b_t for the listed tokens, after the penalties (-100 bans a
//     token in practice, +100 forces it).
// The engine applies them to a copy of the row: the raw row is what logprobs report and the
// logits observer sees. Deterministic (host arithmetic in a fixed order). Steady state does not
// allocate: PenaltyScratch keeps a per-vocabulary count vector and clears only what it touched.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/result.h"

namespace ferry::serve {

struct PenaltyParams {
  float repetition = 1.0f;                                 // > 0; 1: off
  float presence = 0.0f;                                   // [-2, 2]; 0: off
  float frequency = 0.0f;                                  // [-2, 2]; 0: off
  std::vector<std::pair<std::int32_t, float>> logit_bias;  // (token, bias in [-100, 100])
  bool active() const {
    return repetition != 1.0f || presence != 0.0f || frequency != 0.0f || !logit_bias.empty();
  }
};

// Ranges as above; logit_bias tokens in [0, vocab), each listed once.
Status validate(const PenaltyParams& p, std::int64_t vocab);

struct PenaltyScratch {
  std::vector<std::int32_t> count;  // [V]: generated-token counts, zero between calls
  std::vector<std::uint8_t> seen;   // [V]: prompt-or-generated marks, zero between calls
};

// `row` [V] in place; ids outside [0, V) are bugs (the engine validated them).
void apply_penalties(std::span<float> row, const PenaltyParams& p,
                     std::span<const std::int32_t> prompt, std::span<const std::int32_t> generated,
                     PenaltyScratch& scratch);

}  // namespace ferry::serve
