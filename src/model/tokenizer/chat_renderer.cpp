// SPDX-License-Identifier: Apache-2.0
#include "model/tokenizer/chat_renderer.h"

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
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(tokenizer_config_path));
  FERRY_ASSIGN_OR_RETURN(Json doc, parse_json(text, tokenizer_config_path));
  if (!doc.is_object()) return corrupt("tokenizer: {} is not a JSON object", tokenizer_config_path);
  return SpecialTokens{special_token(doc, "bos_token"), special_token(doc, "eos_token")};
}

Result<ChatRenderer> ChatRenderer::from_tokenizer_config(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string source, read_chat_template(path));
  FERRY_ASSIGN_OR_RETURN(SpecialTokens tokens, read_special_tokens(path));
  return from_source(source, std::move(tokens.bos), std::move(tokens.eos));
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
