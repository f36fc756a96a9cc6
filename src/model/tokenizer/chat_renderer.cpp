// SPDX-License-Identifier: Apache-2.0
#include "model/tokenizer/chat_renderer.h"

#include <algorithm>

#include "core/file_util.h"
#include "core/json.h"

namespace ferry::model {
namespace {

// A special token of tokenizer_config.json: "text", {"content": "text", ...} or absent / null.
std::string special_token(const Json& doc, const char* key) {
  if (!doc.contains(key)) return "";
  const Json& v = doc[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

Result<Json> read_config(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  FERRY_ASSIGN_OR_RETURN(Json doc, parse_json(text, path));
  if (!doc.is_object()) return corrupt("tokenizer: {} is not a JSON object", path);
  return doc;
}

SpecialTokens special_tokens_of(const Json& doc) {
  return {special_token(doc, "bos_token"), special_token(doc, "eos_token")};
}

}  // namespace

ChatRenderer ChatRenderer::chatml() { return ChatRenderer(); }

Result<ChatRenderer> ChatRenderer::from_source(std::string_view source, std::string bos_token,
                                               std::string eos_token) {
  ChatRenderer r;
  r.bos_ = std::move(bos_token);
  r.eos_ = std::move(eos_token);
  if (detect_chat_template(source).ok()) return r;  // plain ChatML: the exact native path
  Result<jinja::Template> t = jinja::Template::parse(source);
  if (!t.ok()) {
    return Status(t.status().code(), "chat template: " + t.status().message());
  }
  r.jinja_ = std::make_shared<const jinja::Template>(std::move(*t));
  return r;
}

Result<SpecialTokens> read_special_tokens(const std::string& tokenizer_config_path) {
  FERRY_ASSIGN_OR_RETURN(Json doc, read_config(tokenizer_config_path));
  return special_tokens_of(doc);
}

Result<ChatRenderer> ChatRenderer::from_tokenizer_config(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(Json doc, read_config(path));  // one read for the template and tokens
  FERRY_ASSIGN_OR_RETURN(std::string source, chat_template_of(doc, path));
  SpecialTokens tokens = special_tokens_of(doc);
  return from_source(source, std::move(tokens.bos), std::move(tokens.eos));
}

std::vector<TokenId> model_end_token_ids(const std::string& model_dir, const Tokenizer& tokenizer) {
  std::vector<TokenId> ids;
  if (auto text = read_file(model_dir + "/generation_config.json"); text.ok()) {
    if (auto j = parse_json(*text, "generation_config.json");
        j.ok() && j->is_object() && j->contains("eos_token_id")) {
      const Json& e = (*j)["eos_token_id"];
      for (const Json& x : e.is_array() ? e : Json::array({e})) {
        if (x.is_number_integer()) ids.push_back(x.get<TokenId>());
      }
    }
  }
  if (auto doc = read_config(model_dir + "/tokenizer_config.json"); doc.ok()) {
    const std::string eos = special_token(*doc, "eos_token");
    const TokenId id = eos.empty() ? -1 : tokenizer.token_to_id(eos);
    if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

Result<std::string> ChatRenderer::render(std::span<const ChatMessage> messages,
                                         bool add_generation_prompt) const {
  if (!jinja_) return render_chatml(messages, add_generation_prompt);
  jinja::List msgs;
  for (const ChatMessage& m : messages) {
    msgs.push_back(
        jinja::Value::dict({{"role", jinja::Value(m.role)}, {"content", jinja::Value(m.content)}}));
  }
  const jinja::Dict vars = {{"messages", jinja::Value::list(std::move(msgs))},
                            {"add_generation_prompt", jinja::Value(add_generation_prompt)},
                            {"bos_token", jinja::Value(bos_)},
                            {"eos_token", jinja::Value(eos_)}};
  Result<std::string> out = jinja_->render(vars);
  if (!out.ok()) return invalid_argument("chat template: {}", out.status().message());
  return out;
}

}  // namespace ferry::model
