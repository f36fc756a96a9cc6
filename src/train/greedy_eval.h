// SPDX-License-Identifier: Apache-2.0
// Held-out evaluation: mean loss over the eval examples' trained tokens, and exact-match accuracy
// of greedy decoding. Decoding re-runs the whole forward over the growing sequences (no KV
// cache): the prompts of a group are packed into one batch, each round appends the argmax token
// to every unfinished sequence, and a sequence finishes at <|im_end|> or after max_new_tokens.
// The generated text (before <|im_end|>) must equal the reference answer byte for byte.
// Fine for answers of a few tokens; a KV-cached decoder belongs to `ferry serve`.
// Tests: tests/unit/train/trainer_test.cpp (accuracy of a trained tiny model).
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_compute.h"
#include "model/tokenizer/tokenizer.h"
#include "train/sft_data.h"

namespace ferry::train {

struct EvalResult {
  double loss = 0.0;  // mean nll per trained token
  std::int64_t correct = 0;
  std::int64_t total = 0;
  double accuracy() const { return total > 0 ? double(correct) / double(total) : 0.0; }
};

// max_tokens: the largest T `compute` accepts; logits of at most `logit_tokens` positions are
// materialised at once ([logit_tokens, V] f32).
Result<EvalResult> evaluate(model::ModelCompute& compute, const model::ModelParams& params,
                            const model::Tokenizer& tok, const std::vector<TokenizedExample>& eval,
                            std::int64_t max_tokens, int max_new_tokens);

// Accuracy of always answering the most common training answer (the constant-guess baseline).
double majority_baseline(const std::vector<TokenizedExample>& train,
                         const std::vector<TokenizedExample>& eval);

}  // namespace ferry::train
