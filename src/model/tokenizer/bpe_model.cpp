// SPDX-License-Identifier: Apache-2.0
// BPE model loading and word merging (see bpe_model.h).
#include "model/tokenizer/bpe_model.h"

#include <limits>
#include <queue>

#include "model/tokenizer/utf8.h"

namespace ferry::model::tok {
namespace {

// Splits a merges entry into its two symbols: "a b" or ["a", "b"].
Status parse_merge(const Json& m, std::size_t index, std::string& a, std::string& b) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const std::size_t sp = s.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() ||
        s.find(' ', sp + 1) != std::string::npos) {
      return corrupt("tokenizer: merges[{}] \"{}\" is not two space-separated tokens", index, s);
    }
    a = s.substr(0, sp);
    b = s.substr(sp + 1);
    return ok_status();
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    a = m[0].get<std::string>();
    b = m[1].get<std::string>();
    return ok_status();
  }
  return corrupt("tokenizer: merges[{}] must be a \"a b\" string or a [\"a\", \"b\"] pair", index);
}

Status refuse_option(const Json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return ok_status();
  const Json& v = j[key];
  if ((v.is_boolean() && !v.get<bool>()) || (v.is_string() && v.get<std::string>().empty()) ||
      (v.is_number() && v.get<double>() == 0.0)) {
    return ok_status();
  }
  return unimplemented("tokenizer: BPE option \"{}\" = {} is not supported", key, v.dump());
}

}  // namespace

Result<BpeModel> BpeModel::from_json(const Json& j) {
  if (!j.is_object()) return corrupt("tokenizer: \"model\" must be an object");
  if (j.contains("type")) {
    if (!j["type"].is_string()) return corrupt("tokenizer: model.type must be a string");
    const std::string type = j["type"].get<std::string>();
    if (type != "BPE") {
      return unimplemented("tokenizer: model type \"{}\" is not supported (only BPE)", type);
    }
  }
  if (!j.contains("vocab") || !j["vocab"].is_object()) {
    return corrupt("tokenizer: model.vocab must be an object of token -> id");
  }
  if (!j.contains("merges") || !j["merges"].is_array()) {
    return corrupt("tokenizer: model.merges must be an array");
  }
  for (const char* key :
       {"byte_fallback", "dropout", "continuing_subword_prefix", "end_of_word_suffix"}) {
    FERRY_TRY(refuse_option(j, key));
  }

  BpeModel m;
  const Json& vocab = j["vocab"];
  m.vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const Json& id = it.value();
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
        id.get<std::int64_t>() > std::numeric_limits<TokenId>::max()) {
      return corrupt("tokenizer: model.vocab[\"{}\"] must be a non-negative 32-bit integer id",
                     it.key());
    }
    m.vocab_.emplace(it.key(), static_cast<TokenId>(id.get<std::int64_t>()));
  }

  const Json& merges = j["merges"];
  m.merges_.reserve(merges.size());
  std::string a, b;
  for (std::size_t i = 0; i < merges.size(); ++i) {
    FERRY_TRY(parse_merge(merges[i], i, a, b));
    const TokenId ia = m.token_to_id(a), ib = m.token_to_id(b), im = m.token_to_id(a + b);
    if (ia < 0 || ib < 0 || im < 0) {
      return corrupt(
          "tokenizer: merges[{}] \"{} {}\" refers to a token missing from the vocab "
          "(\"{}\")",
          i, a, b,
          ia < 0   ? a
          : ib < 0 ? b
                   : a + b);
    }
    // Keep the first (lowest) rank when a pair repeats, as HF does.
    m.merges_.try_emplace(pair_key(ia, ib), Merge{static_cast<std::int32_t>(i), im});
  }

  if (j.contains("unk_token") && !j["unk_token"].is_null()) {
    if (!j["unk_token"].is_string()) return corrupt("tokenizer: model.unk_token must be a string");
    const std::string unk = j["unk_token"].get<std::string>();
    m.unk_id_ = m.token_to_id(unk);
    if (m.unk_id_ < 0) return corrupt("tokenizer: model.unk_token \"{}\" is not in the vocab", unk);
  }
  for (auto [key, field] :
       {std::pair{"fuse_unk", &m.fuse_unk_}, {"ignore_merges", &m.ignore_merges_}}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_boolean()) return corrupt("tokenizer: model.{} must be a boolean", key);
    *field = j[key].get<bool>();
  }
  return m;
}

TokenId BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::encode_word(std::string_view word, std::vector<TokenId>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const TokenId id = token_to_id(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    if (const auto it = cache_->map.find(word); it != cache_->map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_->mu);
    if (cache_->map.size() < kCacheEntries) {
      cache_->map.try_emplace(std::string(word), out.begin() + static_cast<std::ptrdiff_t>(first),
                              out.end());
    }
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<TokenId>& out) const {
  // Symbols: one per code point to start with, linked so merges are O(1).
  struct Symbol {
    TokenId id;
    std::int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  std::size_t i = 0;
  while (i < word.size()) {
    std::size_t len = utf8_valid_length(word, i);
    if (len == 0) len = 1;  // words come from valid UTF-8; stay safe regardless
    const TokenId id = token_to_id(word.substr(i, len));
    i += len;
    if (id < 0) {
      if (unk_id_ < 0) continue;
      if (fuse_unk_ && !syms.empty() && syms.back().id == unk_id_) continue;
      syms.push_back({unk_id_, 0, 0, true});
      continue;
    }
    syms.push_back({id, 0, 0, true});
  }
  const auto n = static_cast<std::int32_t>(syms.size());
  for (std::int32_t k = 0; k < n; ++k) {
    syms[k].prev = k - 1;
    syms[k].next = k + 1 < n ? k + 1 : -1;
  }

  // Candidate merges ordered by (rank, position); stale entries are skipped when popped.
  struct Candidate {
    std::int32_t rank, pos;
    TokenId left, right, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto push = [&](std::int32_t pos) {
    if (pos < 0 || syms[pos].next < 0) return;
    const TokenId l = syms[pos].id, r = syms[syms[pos].next].id;
    if (const auto it = merges_.find(pair_key(l, r)); it != merges_.end()) {
      heap.push({it->second.rank, pos, l, r, it->second.merged});
    }
  };
  for (std::int32_t k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = syms[c.pos];
    if (!left.alive || left.next < 0 || left.id != c.left) continue;
    Symbol& right = syms[left.next];
    if (right.id != c.right) continue;
    left.id = c.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = c.pos;
    push(left.prev);
    push(c.pos);
  }
  for (std::int32_t k = n > 0 ? 0 : -1; k >= 0; k = syms[k].next) out.push_back(syms[k].id);
}

}  // namespace ferry::model::tok
