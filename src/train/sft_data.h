// SPDX-License-Identifier: Apache-2.0
// Supervised fine-tuning examples: JSONL reading and ChatML tokenization with response-only loss.
//
// A JSONL line is either {"prompt": "...", "response": "..."} (one user turn, one assistant
// turn) or {"messages": [{"role": "...", "content": "..."}, ...]} (every assistant turn is
// trained). Malformed lines are reported as "file:line: why" and skipped, or refused (strict).
//
// Tokenization renders ChatML (model/tokenizer/chat_template.h) piece by piece:
//   "<|im_start|>" role "\n"   masked
//   content                     masked, or trained when role == assistant
//   "<|im_end|>"                masked, or trained when role == assistant
//   "\n"                        masked (not emitted after the final message: nothing follows it)
// Each piece is encoded on its own and the ids concatenated, so a prompt at evaluation time
// (everything before the last assistant content) is the exact id prefix the model trained on.
// targets[t] = ids[t+1] when token t+1 is trained, else -100 (next-token prediction).
// Tests: tests/unit/train/sft_data_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/tokenizer.h"

namespace ferry::train {

inline constexpr std::int32_t kIgnoreTarget = -100;

struct SftExample {
  std::vector<model::ChatMessage> messages;  // at least one assistant message
};

struct TokenizedExample {
  std::vector<std::int32_t> ids;      // [n]
  std::vector<std::int32_t> targets;  // [n], kIgnoreTarget where not trained
  std::int64_t prompt_len = 0;        // ids before the last assistant content (eval prompt)
  std::string answer;                 // the last assistant content (eval exact match)
  std::int64_t trained() const;       // targets != kIgnoreTarget
};

enum class OverlongPolicy : unsigned char { kTruncate, kSkip };

struct DataReport {
  std::int64_t lines = 0;      // non-empty lines read
  std::int64_t malformed = 0;  // lines skipped as malformed
  std::int64_t truncated = 0;  // examples cut to seq_len tokens
  std::int64_t skipped = 0;    // examples dropped (too long under kSkip, or nothing trained)
  std::int64_t examples = 0;   // examples kept
  std::vector<std::string> first_errors;  // up to 10 "file:line: why" messages
};

// Parses one JSONL record. `where` ("file:line") prefixes the error.
Result<SftExample> parse_sft_record(std::string_view line, const std::string& where);

// Reads a JSONL file. Malformed lines: strict -> invalid_argument naming file:line; otherwise
// counted in report (and logged) and skipped. A file without any valid example is an error.
Result<std::vector<SftExample>> read_sft_jsonl(const std::string& path, bool strict,
                                               DataReport* report);

Result<TokenizedExample> tokenize_example(const model::Tokenizer& tok, const SftExample& ex);

// Tokenizes all examples and applies the length limit (seq_len tokens per sequence).
Result<std::vector<TokenizedExample>> tokenize_dataset(const model::Tokenizer& tok,
                                                       const std::vector<SftExample>& examples,
                                                       std::int64_t seq_len,
                                                       OverlongPolicy overlong, DataReport* report);

}  // namespace ferry::train
