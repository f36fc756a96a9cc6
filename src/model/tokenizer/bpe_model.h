// SPDX-License-Identifier: Apache-2.0
// The BPE model of tokenizer.json ("model": {"type": "BPE", "vocab", "merges", ...}): encodes one
// pre-tokenized word (a string of vocabulary symbols, byte-level mapped for GPT-2-style models)
// into token ids by repeatedly applying the lowest-ranked merge (leftmost on ties), exactly as HF's
// BPE::merge_word does. Merging uses a doubly linked symbol list and a min-heap, O(n log n) in
// the word length, so a megabyte of spaces or digits costs no more than a megabyte of text.
// Both merges encodings are read: "a b" strings and ["a", "b"] pairs.
// ignore_merges (Llama 3): a word that is itself in the vocabulary maps to that id directly.
// A word cache (at most kCacheEntries words of < 256 bytes, never evicted, like HF's) makes
// repeated words cost one hash lookup. Unsupported options (byte_fallback, dropout > 0,
// continuing_subword_prefix, end_of_word_suffix) are refused at load time.
// Thread-safety: encode_word may run concurrently (the cache is behind a mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/json.h"
#include "core/result.h"

namespace ferry::model::tok {

using TokenId = std::int32_t;

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using VocabMap = std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  static constexpr std::size_t kCacheEntries = 10000;
  static constexpr std::size_t kMaxCachedWordBytes = 256;

  // j: the "model" object.
  static Result<BpeModel> from_json(const Json& j);

  // Appends the ids of word to out. Symbols missing from the vocabulary become unk_token when the
  // model has one and are dropped otherwise (HF behaviour; cannot happen for byte-level vocabs
  // that contain all 256 byte symbols).
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;

  const VocabMap& vocab() const { return vocab_; }
  // Id of token, or -1.
  TokenId token_to_id(std::string_view token) const;

 private:
  struct Merge {
    std::int32_t rank;
    TokenId merged;
  };
  static std::uint64_t pair_key(TokenId a, TokenId b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
           static_cast<std::uint32_t>(b);
  }
  void merge_word(std::string_view word, std::vector<TokenId>& out) const;

  VocabMap vocab_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  TokenId unk_id_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  struct Cache {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>> map;
  };
  std::unique_ptr<Cache> cache_ = std::make_unique<Cache>();
};

}  // namespace ferry::model::tok
