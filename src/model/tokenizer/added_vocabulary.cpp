// SPDX-License-Identifier: Apache-2.0
// Added-token parsing and leftmost-longest splitting (see added_vocabulary.h). Patterns are
// bucketed by their first byte; the scan tries the few patterns of the current byte's bucket at
// each position, which is linear in the text for realistic token sets.
#include "model/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <limits>

#include "model/tokenizer/utf8.h"

namespace ferry::model::tok {
namespace {

Result<bool> flag(const Json& t, const char* key, bool fallback, std::size_t index) {
  if (!t.contains(key) || t[key].is_null()) return fallback;
  if (!t[key].is_boolean())
    return corrupt("tokenizer: added_tokens[{}].{} must be a boolean", index, key);
  return t[key].get<bool>();
}

bool is_word_char(char32_t cp) {
  // ASCII alphanumerics and '_' plus any non-ASCII letter-ish code point (a conservative reading
  // of regex \w that needs no Unicode tables).
  return cp == '_' || (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') ||
         (cp >= 'A' && cp <= 'Z') || (cp >= 0x80 && !is_unicode_whitespace(cp));
}

// Code point ending at byte offset end (exclusive) of s; 0 when end == 0.
char32_t code_point_before(std::string_view s, std::size_t end, std::size_t* len) {
  if (end == 0) {
    *len = 0;
    return 0;
  }
  std::size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return utf8_decode(s, b, len);
}

}  // namespace

Result<AddedVocabulary> AddedVocabulary::from_json(const Json& j, const Normalizer& normalizer) {
  AddedVocabulary v;
  if (j.is_null()) return v;
  if (!j.is_array()) return corrupt("tokenizer: \"added_tokens\" must be an array");
  for (std::size_t i = 0; i < j.size(); ++i) {
    const Json& t = j[i];
    if (!t.is_object()) return corrupt("tokenizer: added_tokens[{}] must be an object", i);
    if (!t.contains("id") || !t["id"].is_number_integer() || t["id"].get<std::int64_t>() < 0 ||
        t["id"].get<std::int64_t>() > std::numeric_limits<TokenId>::max()) {
      return corrupt("tokenizer: added_tokens[{}].id must be a non-negative 32-bit integer", i);
    }
    if (!t.contains("content") || !t["content"].is_string()) {
      return corrupt("tokenizer: added_tokens[{}].content must be a string", i);
    }
    AddedToken a;
    a.id = static_cast<TokenId>(t["id"].get<std::int64_t>());
    a.content = t["content"].get<std::string>();
    FERRY_ASSIGN_OR_RETURN(a.single_word, flag(t, "single_word", false, i));
    FERRY_ASSIGN_OR_RETURN(a.lstrip, flag(t, "lstrip", false, i));
    FERRY_ASSIGN_OR_RETURN(a.rstrip, flag(t, "rstrip", false, i));
    FERRY_ASSIGN_OR_RETURN(a.special, flag(t, "special", false, i));
    FERRY_ASSIGN_OR_RETURN(a.normalized, flag(t, "normalized", !a.special, i));
    if (a.content.empty()) continue;
    if (const auto it = v.by_id_.find(a.id); it != v.by_id_.end()) {
      if (v.tokens_[it->second].content != a.content) {
        return corrupt("tokenizer: added_tokens id {} is given to both \"{}\" and \"{}\"", a.id,
                       v.tokens_[it->second].content, a.content);
      }
      continue;
    }
    v.by_id_.emplace(a.id, v.tokens_.size());
    v.tokens_.push_back(std::move(a));
  }
  for (std::size_t k = 0; k < v.tokens_.size(); ++k) {
    const AddedToken& a = v.tokens_[k];
    std::string text = a.content;
    if (a.normalized && !normalizer.empty()) {
      FERRY_ASSIGN_OR_RETURN(text, normalizer.apply(a.content));
    }
    if (text.empty()) continue;
    const int kind = a.normalized ? 1 : 0;
    v.buckets_[kind][static_cast<unsigned char>(text[0])].push_back({std::move(text), k});
    v.any_[kind] = true;
  }
  for (auto& kind : v.buckets_) {
    for (auto& bucket : kind) {
      std::stable_sort(bucket.begin(), bucket.end(), [](const Pattern& x, const Pattern& y) {
        return x.text.size() > y.text.size();
      });
    }
  }
  return v;
}

const AddedToken* AddedVocabulary::find_id(TokenId id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::find_content(std::string_view content) const {
  for (const AddedToken& a : tokens_) {
    if (a.content == content) return &a;
  }
  return nullptr;
}

void AddedVocabulary::split(std::string_view text, bool normalized,
                            std::vector<Segment>& out) const {
  const int kind = normalized ? 1 : 0;
  if (!any_[kind]) {
    if (!text.empty()) out.push_back({std::string(text), -1});
    return;
  }
  std::size_t emitted = 0;  // text before this offset is already in out
  std::size_t pos = 0;
  while (pos < text.size()) {
    const Pattern* hit = nullptr;
    for (const Pattern& p : buckets_[kind][static_cast<unsigned char>(text[pos])]) {
      if (text.compare(pos, p.text.size(), p.text) != 0) continue;
      const AddedToken& a = tokens_[p.token];
      if (a.single_word) {
        std::size_t len = 0;
        const char32_t before = code_point_before(text, pos, &len);
        const std::size_t end = pos + p.text.size();
        const bool word_before = pos > 0 && is_word_char(before);
        const bool word_after = end < text.size() && is_word_char(utf8_decode(text, end, &len));
        if (word_before || word_after) continue;
      }
      hit = &p;
      break;
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    const AddedToken& a = tokens_[hit->token];
    std::size_t begin = pos, end = pos + hit->text.size();
    if (a.lstrip) {
      while (begin > emitted) {
        std::size_t len = 0;
        const char32_t cp = code_point_before(text, begin, &len);
        if (!is_unicode_whitespace(cp)) break;
        begin -= len;
      }
    }
    if (a.rstrip) {
      while (end < text.size()) {
        std::size_t len = 0;
        const char32_t cp = utf8_decode(text, end, &len);
        if (!is_unicode_whitespace(cp)) break;
        end += len;
      }
    }
    if (begin > emitted) out.push_back({std::string(text.substr(emitted, begin - emitted)), -1});
    out.push_back({std::string(text.substr(begin, end - begin)), a.id});
    emitted = pos = end;
  }
  if (emitted < text.size()) out.push_back({std::string(text.substr(emitted)), -1});
}

}  // namespace ferry::model::tok
