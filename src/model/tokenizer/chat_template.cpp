// SPDX-License-Identifier: Apache-2.0
// ChatML rendering and template detection (see chat_template.h). Detection compares a canonical
// form of the source (whitespace removed, " -> ', Jinja "-" trim markers dropped) against the
// canonical forms of the known ChatML spellings.
#include "model/tokenizer/chat_template.h"

#include <array>

#include "core/file_util.h"
#include "core/json.h"

namespace ferry::model {

const std::string_view kChatMlJinja =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

namespace {

// Spellings of the same ChatML template seen in model repos.
constexpr std::array<std::string_view, 2> kChatMlVariants = {
    "{% for message in messages %}"
    "{{'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
};

std::string canonical(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    out.push_back(c == '"' ? '\'' : c);
  }
  for (const std::string_view marker : {"{%-", "{{-", "-%}", "-}}"}) {
    const std::string plain =
        marker[0] == '{' ? std::string(marker.substr(0, 2)) : std::string(marker.substr(1));
    for (std::size_t p = out.find(marker); p != std::string::npos; p = out.find(marker, p)) {
      out.replace(p, marker.size(), plain);
    }
  }
  return out;
}

}  // namespace

std::string render_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out += "<|im_start|>";
    out += m.role;
    out += '\n';
    out += m.content;
    out += "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

Result<ChatTemplateKind> detect_chat_template(std::string_view jinja_source) {
  const std::string c = canonical(jinja_source);
  if (c == canonical(kChatMlJinja)) return ChatTemplateKind::kChatMl;
  for (const std::string_view v : kChatMlVariants) {
    if (c == canonical(v)) return ChatTemplateKind::kChatMl;
  }
  std::string head(jinja_source.substr(0, 80));
  for (char& ch : head) {
    if (ch == '\n') ch = ' ';
  }
  return unimplemented(
      "tokenizer: unsupported chat template (ferry implements only plain ChatML, "
      "see docs/tokenizer.md); template starts \"{}\"",
      head);
}

Result<std::string> read_chat_template(const std::string& tokenizer_config_path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(tokenizer_config_path));
  FERRY_ASSIGN_OR_RETURN(Json doc, parse_json(text, tokenizer_config_path));
  return chat_template_of(doc, tokenizer_config_path);
}

Result<std::string> chat_template_of(const Json& doc, const std::string& tokenizer_config_path) {
  if (!doc.is_object() || !doc.contains("chat_template") || doc["chat_template"].is_null()) {
    return not_found("tokenizer: {} has no chat_template", tokenizer_config_path);
  }
  const Json& t = doc["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const Json& e : t) {
      if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
          e["template"].is_string()) {
        return e["template"].get<std::string>();
      }
    }
    return not_found("tokenizer: {}: chat_template list has no \"default\" entry",
                     tokenizer_config_path);
  }
  return corrupt("tokenizer: {}: chat_template must be a string or a list of {{name, template}}",
                 tokenizer_config_path);
}

std::string render_chat(ChatTemplateKind kind, std::span<const ChatMessage> messages,
                        bool add_generation_prompt) {
  switch (kind) {
    case ChatTemplateKind::kChatMl:
      return render_chatml(messages, add_generation_prompt);
  }
  FERRY_CHECK(false, "render_chat: unknown template kind {}", static_cast<int>(kind));
  return {};
}

}  // namespace ferry::model
