// SPDX-License-Identifier: Apache-2.0
// Pre-tokenizers from tokenizer.json ("pre_tokenizer"): turn one normalized text segment into
// words that BPE encodes independently. Supported: Split (Regex or String pattern; behaviors
// Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel
// (add_prefix_space, use_regex with GPT-2's pattern; maps bytes through the GPT-2 table) and
// Sequence of those — the forms Qwen2/Qwen3 (Split + ByteLevel(use_regex=false)), Llama 3 (same)
// and GPT-2 (ByteLevel(use_regex=true)) use. Anything else is refused at load time.
// Thread-safety: immutable after from_json; split() may run concurrently.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "model/tokenizer/regex.h"

namespace ferry::model::tok {

enum class SplitBehavior : unsigned char {
  kIsolated,
  kRemoved,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous,
};

struct PreTokenizerStep {
  enum class Kind : unsigned char { kSplit, kByteLevel } kind = Kind::kSplit;
  Regex regex;             // kSplit: the pattern; kByteLevel with use_regex: GPT-2's
  bool has_regex = false;  // kByteLevel: use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;            // kSplit
  bool add_prefix_space = false;  // kByteLevel
};

class PreTokenizer {
 public:
  // j: the "pre_tokenizer" value (null means the whole segment is one word).
  static Result<PreTokenizer> from_json(const Json& j);

  // Appends the words of segment (valid UTF-8) to out; words are byte-level mapped when a
  // ByteLevel step is present.
  Status split(std::string_view segment, std::vector<std::string>& out) const;

  bool byte_level() const { return byte_level_; }

 private:
  std::vector<PreTokenizerStep> steps_;
  bool byte_level_ = false;
};

// GPT-2's pre-split pattern (HF ByteLevel use_regex=true).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Splits s by the matches of regex according to behavior (HF SplitDelimiterBehavior), appending
// the non-empty pieces to out.
Status split_by_regex(const Regex& regex, SplitBehavior behavior, bool invert, std::string_view s,
                      std::vector<std::string>& out);

}  // namespace ferry::model::tok
