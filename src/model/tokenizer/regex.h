// SPDX-License-Identifier: Apache-2.0
// A compiled PCRE2 pattern for the tokenizer's pre-split (HF's Split / ByteLevel pre-tokenizers).
// Compiled in UTF + UCP mode so \s, \p{L}, \p{N} and (?i:...) follow Unicode like HF's Oniguruma
// patterns; JIT-compiled when the PCRE2 build supports it (falls back to the interpreter).
// Subjects must be valid UTF-8 (the tokenizer validates input once; matching skips the check).
// Thread-safety: a compiled Regex is immutable; find_all may run concurrently (per-call match
// data, per-thread JIT stack).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"

namespace ferry::model::tok {

struct Span {
  std::size_t begin = 0;
  std::size_t end = 0;  // exclusive
};

class Regex {
 public:
  // literal: match the pattern text as a plain string (HF's Split {"String": ...}).
  static Result<Regex> compile(std::string_view pattern, bool literal = false);

  // Appends every non-empty, non-overlapping match in s, left to right. Empty matches are
  // skipped (the search resumes one code point later).
  Status find_all(std::string_view s, std::vector<Span>& out) const;

  const std::string& pattern() const { return pattern_; }
  bool jit() const { return jit_; }

 private:
  struct Code;
  std::shared_ptr<Code> code_;
  std::string pattern_;
  bool jit_ = false;
};

}  // namespace ferry::model::tok
