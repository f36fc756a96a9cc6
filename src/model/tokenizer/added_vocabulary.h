// SPDX-License-Identifier: Apache-2.0
// Added tokens of tokenizer.json ("added_tokens"): strings such as <|im_start|> that are matched
// in the input before any pre-splitting, so the regex never cuts through them. Matching is
// leftmost-longest (the earliest match wins; among matches starting there, the longest), as HF's
// Aho-Corasick LeftmostLongest. Tokens with normalized=false are matched on the raw text; those
// with normalized=true on the normalized text, against their normalized content. lstrip/rstrip
// widen a match over adjacent Unicode whitespace; single_word requires no word character
// (alphanumeric or '_') right before or after the match. Entries with empty content are ignored
// (as HF does). Thread-safety: immutable after construction.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "model/tokenizer/bpe_model.h"
#include "model/tokenizer/normalizer.h"

namespace ferry::model::tok {

struct AddedToken {
  TokenId id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A piece of the input: either text still to be tokenized (id < 0) or a matched added token.
struct Segment {
  std::string text;
  TokenId id = -1;
};

class AddedVocabulary {
 public:
  // j: the "added_tokens" array (absent or null: none). normalizer: applied to the content of
  // normalized tokens.
  static Result<AddedVocabulary> from_json(const Json& j, const Normalizer& normalizer);

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  // The added token with this id, or nullptr.
  const AddedToken* find_id(TokenId id) const;
  // The added token with this content, or nullptr.
  const AddedToken* find_content(std::string_view content) const;

  // Splits text (valid UTF-8) on the tokens of one kind (normalized or not), appending segments.
  void split(std::string_view text, bool normalized, std::vector<Segment>& out) const;

 private:
  struct Pattern {
    std::string text;   // what is matched
    std::size_t token;  // index into tokens_
  };
  std::vector<AddedToken> tokens_;
  std::unordered_map<TokenId, std::size_t> by_id_;
  // Per kind (0 raw, 1 normalized), patterns bucketed by first byte, longest first.
  std::vector<Pattern> buckets_[2][256];
  bool any_[2] = {false, false};
};

}  // namespace ferry::model::tok
