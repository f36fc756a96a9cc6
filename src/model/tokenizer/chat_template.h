// SPDX-License-Identifier: Apache-2.0
// Chat templates without a Jinja engine. ferry implements exactly one template, plain ChatML:
//   for each message:  "<|im_start|>" + role + "\n" + content + "<|im_end|>\n"
//   then, when add_generation_prompt: "<|im_start|>assistant\n"
// Messages are rendered as given: no default system message is inserted (Qwen2.5's and Qwen3's own
// templates add one and handle tools/thinking; those are refused, not approximated).
// detect_chat_template() recognises the ChatML Jinja source (whitespace, quote style and Jinja
// trim markers aside) and refuses anything else with an unimplemented Status, so a model with a
// different template never gets silently wrong prompts. Tests: chat_template_test.cpp and the HF
// fixture tests/data/tokenizer/qwen2/chat_cases.jsonl (transformers' apply_chat_template).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/json.h"
#include "core/result.h"

namespace ferry::model {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

enum class ChatTemplateKind : unsigned char { kChatMl };

// The Jinja source of the ChatML template above (what tokenizer_config.json holds for it).
extern const std::string_view kChatMlJinja;

std::string render_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt);

// Classifies a Jinja chat template source; unknown templates give an unimplemented Status.
Result<ChatTemplateKind> detect_chat_template(std::string_view jinja_source);

// Reads "chat_template" from a tokenizer_config.json: a string, or a list of {name, template}
// (the "default" entry is used). not_found when the file has no chat_template.
Result<std::string> read_chat_template(const std::string& tokenizer_config_path);
// The same from a parsed tokenizer_config.json (the path only names it in messages).
Result<std::string> chat_template_of(const Json& doc, const std::string& tokenizer_config_path);

// Renders with the template kind (only ChatML today).
std::string render_chat(ChatTemplateKind kind, std::span<const ChatMessage> messages,
                        bool add_generation_prompt);

}  // namespace ferry::model
