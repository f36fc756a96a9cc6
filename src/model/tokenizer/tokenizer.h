// SPDX-License-Identifier: Apache-2.0
// Tokenizer: Hugging Face tokenizer.json byte-level BPE (Qwen2/Qwen2.5/Qwen3, Llama 3, GPT-2).
//
// encode(text):  validate UTF-8 -> split on non-normalized added tokens -> normalize the rest
//   (normalizer.h) -> split on normalized added tokens -> pre-tokenize each remaining piece into
//   words (pre_tokenizer.h: regex split, GPT-2 byte mapping) -> BPE each word (bpe_model.h) ->
//   post-process (post_processor.h) when add_special_tokens.
// decode(ids):   model tokens go through the ByteLevel decoder (symbols back to bytes); added
//   tokens are appended verbatim (so decode(encode(x)) == normalize(x) for every valid UTF-8 x,
//   special-token text included, lstrip/rstrip whitespace aside); special ones are dropped when
//   skip_special_tokens. Bytes that do not form valid UTF-8 (an id sequence cut inside a character)
//   become U+FFFD.
// Loading never aborts on bad input: malformed files give a corrupt Status naming the field,
// valid-but-unsupported components (WordPiece, Metaspace, ...) an unimplemented Status.
// Thread-safety: a loaded Tokenizer is immutable apart from an internal word cache behind a mutex;
// encode/decode may run concurrently. Tests: tests/unit/tokenizer/ (HF fixtures in
// tests/data/tokenizer/, made by tools/fixtures/make_tokenizer_fixtures.py).
//
//   FERRY_ASSIGN_OR_RETURN(auto tok, Tokenizer::from_file(dir + "/tokenizer.json"));
//   FERRY_ASSIGN_OR_RETURN(auto ids, tok.encode("Hello", {.add_special_tokens = true}));
//   FERRY_ASSIGN_OR_RETURN(std::string text, tok.decode(ids));
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "model/tokenizer/bpe_model.h"

namespace ferry::model {

using TokenId = tok::TokenId;

struct EncodeOptions {
  bool add_special_tokens = false;  // apply the post_processor template (e.g. Llama 3's BOS)
};

struct DecodeOptions {
  bool skip_special_tokens = false;
};

class Tokenizer {
 public:
  static Result<Tokenizer> from_file(const std::string& path);
  // what: names the document in errors.
  static Result<Tokenizer> from_json_text(std::string_view json_text,
                                          std::string_view what = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Fails (invalid_argument) when text is not valid UTF-8.
  Result<std::vector<TokenId>> encode(std::string_view text, const EncodeOptions& opts = {}) const;
  // Fails (out_of_range) on an id that is neither in the vocab nor an added token.
  Result<std::string> decode(std::span<const TokenId> ids, const DecodeOptions& opts = {}) const;
  // The bytes one token decodes to before UTF-8 repair (a byte-level token may hold part of a
  // character): what decode() concatenates. Special tokens give their text. out_of_range for an
  // id outside the vocabulary.
  Result<std::string> token_bytes(TokenId id) const;

  // The text encode() tokenizes after normalization (identity without a normalizer; added tokens
  // matched on the raw text are left as they are), so that
  // decode(encode(x)) == normalize(x) for valid UTF-8 x, except around added tokens with
  // lstrip/rstrip, which absorb the whitespace next to them.
  Result<std::string> normalize(std::string_view text) const;

  // The vocabulary string of id (byte-level symbols for model tokens), or "" when unknown.
  std::string_view id_to_token(TokenId id) const;
  // Id of a vocabulary string or added token content, or -1.
  TokenId token_to_id(std::string_view token) const;
  bool is_special(TokenId id) const;
  // One more than the largest id.
  std::size_t vocab_size() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::model
