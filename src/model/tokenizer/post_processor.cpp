// SPDX-License-Identifier: Apache-2.0
// TemplateProcessing / ByteLevel / Sequence post-processors (see post_processor.h). A template
// item {"SpecialToken": {"id": NAME}} resolves NAME through the "special_tokens" map to its ids;
// {"Sequence": {"id": "A"}} stands for the encoded text.
#include "model/tokenizer/post_processor.h"

#include <limits>

namespace ferry::model::tok {
namespace {

Status add(const Json& j, std::vector<std::vector<std::pair<bool, std::vector<TokenId>>>>& out,
           int depth) {
  if (depth > 8) return corrupt("tokenizer: post_processor Sequence nested too deeply");
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return corrupt("tokenizer: post_processor must be an object with a string \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return ok_status();
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array()) {
      return corrupt("tokenizer: post_processor Sequence needs a \"processors\" array");
    }
    for (const Json& p : j["processors"]) FERRY_TRY(add(p, out, depth + 1));
    return ok_status();
  }
  if (type != "TemplateProcessing") {
    return unimplemented(
        "tokenizer: post_processor type \"{}\" is not supported "
        "(TemplateProcessing, ByteLevel, Sequence)",
        type);
  }
  if (!j.contains("single") || !j["single"].is_array()) {
    return corrupt("tokenizer: TemplateProcessing needs a \"single\" array");
  }
  const Json empty = Json::object();
  const Json& specials = j.contains("special_tokens") ? j["special_tokens"] : empty;
  if (!specials.is_object())
    return corrupt("tokenizer: TemplateProcessing.special_tokens must be an object");
  std::vector<std::pair<bool, std::vector<TokenId>>> items;
  for (const Json& it : j["single"]) {
    if (it.is_object() && it.contains("Sequence") && it["Sequence"].is_object()) {
      const Json& s = it["Sequence"];
      if (!s.contains("id") || s["id"] != "A") {
        return corrupt("tokenizer: TemplateProcessing single template may only use sequence A");
      }
      items.push_back({true, {}});
      continue;
    }
    if (!it.is_object() || !it.contains("SpecialToken") || !it["SpecialToken"].is_object() ||
        !it["SpecialToken"].contains("id") || !it["SpecialToken"]["id"].is_string()) {
      return corrupt(
          "tokenizer: TemplateProcessing item {} is neither a Sequence nor a SpecialToken",
          it.dump());
    }
    const std::string name = it["SpecialToken"]["id"].get<std::string>();
    if (!specials.contains(name) || !specials[name].is_object() ||
        !specials[name].contains("ids") || !specials[name]["ids"].is_array()) {
      return corrupt(
          "tokenizer: TemplateProcessing uses special token \"{}\" with no ids in "
          "special_tokens",
          name);
    }
    std::vector<TokenId> ids;
    for (const Json& id : specials[name]["ids"]) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
          id.get<std::int64_t>() > std::numeric_limits<TokenId>::max()) {
        return corrupt("tokenizer: TemplateProcessing special token \"{}\" has a bad id", name);
      }
      ids.push_back(static_cast<TokenId>(id.get<std::int64_t>()));
    }
    items.push_back({false, std::move(ids)});
  }
  out.push_back(std::move(items));
  return ok_status();
}

}  // namespace

Result<PostProcessor> PostProcessor::from_json(const Json& j) {
  PostProcessor p;
  if (j.is_null()) return p;
  std::vector<std::vector<std::pair<bool, std::vector<TokenId>>>> raw;
  FERRY_TRY(add(j, raw, 0));
  for (auto& t : raw) {
    std::vector<PostProcessor::Item> items;
    for (auto& [is_seq, ids] : t) items.push_back({is_seq, std::move(ids)});
    p.templates_.push_back(std::move(items));
  }
  return p;
}

std::vector<TokenId> PostProcessor::apply(const std::vector<TokenId>& ids) const {
  std::vector<TokenId> cur = ids;
  for (const auto& t : templates_) {
    std::vector<TokenId> next;
    next.reserve(cur.size() + 4);
    for (const Item& item : t) {
      const auto& src = item.is_sequence ? cur : item.ids;
      next.insert(next.end(), src.begin(), src.end());
    }
    cur.swap(next);
  }
  return cur;
}

}  // namespace ferry::model::tok
