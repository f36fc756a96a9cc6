// SPDX-License-Identifier: Apache-2.0
// LogprobsJson: the "logprobs" object of one OpenAI-style choice, built token by token (a whole
// answer, or the tokens of one streamed chunk).
//   /v1/completions (legacy format): {"tokens": [str], "token_logprobs": [x | null],
//     "top_logprobs": [{str: x} | null], "text_offset": [byte offset in the choice's text]};
//     each top dict holds the n most likely tokens and the chosen one (as vLLM); the first token
//     of an echoed prompt has null logprob and top (nothing precedes it).
//   /v1/chat/completions: {"content": [{"token", "logprob", "bytes", "top_logprobs":
//     [{"token", "logprob", "bytes"}]}]}.
// A token's string is its bytes as UTF-8 (a byte-level token holding part of a character shows
// U+FFFD; "bytes" has the raw values); without a tokenizer it is "token_id:<id>" (vLLM's form).
// text_offset: where each token starts in the choice's text (the echoed prompt included), in
// bytes, counting each token's raw bytes (special tokens 0: the text leaves them out). Exact
// whenever the text is valid UTF-8; where it is not, each invalid byte shows as the 3 bytes of
// U+FFFD and the offsets after it fall behind.
#pragma once

#include <cstdint>
#include <string>

#include "core/json.h"
#include "model/tokenizer/tokenizer.h"
#include "serve/logprobs.h"

namespace ferry::serve::http {

class LogprobsJson {
 public:
  // tokenizer may be null (token-id prompts on a model without one).
  LogprobsJson(const model::Tokenizer* tokenizer, bool chat);
  // Appends a token; lp null: a token with no logprob (the first prompt token; completions only).
  void add(std::int32_t token, const TokenLogprob* lp);
  bool empty() const { return count_ == 0; }
  // The object for the tokens added since the last take (the offsets run on).
  Json take();

 private:
  struct Piece {
    std::string text, bytes;
    std::size_t shown_bytes = 0;  // what the token adds to the response text
  };
  Piece piece(std::int32_t token) const;
  Json bytes_json(const std::string& raw) const;

  const model::Tokenizer* tok_;
  bool chat_;
  std::size_t count_ = 0, offset_ = 0;
  Json tokens_, token_logprobs_, top_logprobs_, text_offset_, content_;
};

}  // namespace ferry::serve::http
