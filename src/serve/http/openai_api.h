// SPDX-License-Identifier: Apache-2.0
// The OpenAI-style request bodies the HTTP server accepts, parsed into plain structs, and the
// text rules of its responses. Pure functions (no engine, no sockets), so they test alone.
//   POST /v1/completions       {"prompt": "text" | [ids] | ["text" | [ids], ..] (a batch), "n",
//                               "max_tokens", "temperature", "top_p",
//                               "top_k", "min_p" (vLLM extension), "seed", "stop": "s" | ["s", ..],
//                               "stream", "model", "ignore_eos" (vLLM extension), "logprobs": n
//                               (0..20), "echo", "stream_options": {"include_usage"},
//                               "presence_penalty", "frequency_penalty", "repetition_penalty" (vLLM
//                               extension), "logit_bias": {"id": bias}, "stop_token_ids" (vLLM
//                               extension)}
//                              echo + logprobs + max_tokens 0 scores the prompt (what
//                              lm-evaluation-harness's loglikelihood requests send)
//   POST /v1/chat/completions  {"messages": [{"role", "content"}, ..], same parameters but echo,
//                               "logprobs": true, "top_logprobs": n, "max_completion_tokens"}
// Malformed JSON, a missing or mistyped field and out-of-range values are invalid_argument with
// a message naming the field; the server turns them into 400 {"error": {...}}.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "model/tokenizer/chat_template.h"
#include "serve/logprobs.h"
#include "serve/sampler.h"

namespace ferry::serve::http {

// A request's choices: its prompts (completions may batch them) times n.
inline constexpr std::size_t kMaxPromptsPerRequest = 64;
inline constexpr int kMaxChoicesPerRequest = 64;

// One completions prompt: text, or token ids when text is unset.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<std::int32_t> ids;
};

struct CompletionParams {
  bool chat = false;
  std::string model;                         // "" when the body names none
  std::vector<PromptInput> prompts;          // completions: one, or a batch (choices in order)
  std::vector<model::ChatMessage> messages;  // chat
  int n = 1;                                 // choices per prompt
  int max_tokens = 16;
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<std::int32_t> stop_token_ids;  // besides the tokenizer's end tokens
  bool stream = false;
  bool ignore_eos = false;     // vLLM's extension: do not stop at the tokenizer's end tokens
  int logprobs = -1;           // -1 off; else alternatives per position (serve/logprobs.h)
  bool echo = false;           // completions: the prompt (and its logprobs) in front of the answer
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
};

Result<CompletionParams> parse_completion_request(std::string_view body, bool chat,
                                                  int default_max_tokens);

// Appends bytes[from..] to `out` as valid UTF-8: each byte that does not start a well-formed
// sequence becomes U+FFFD. Unless `final`, an incomplete but so-far valid sequence at the end is
// left for later. Returns the index after the last byte consumed. Decisions depend only on the
// bytes of one sequence, so sanitizing a stream piecewise gives the same text as all at once.
std::size_t append_utf8_sanitized(std::string_view bytes, std::size_t from, bool final,
                                  std::string& out);

}  // namespace ferry::serve::http
