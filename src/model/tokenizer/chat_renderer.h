// SPDX-License-Identifier: Apache-2.0
// A model's chat template, rendered as transformers' apply_chat_template renders it: plain ChatML
// (chat_template.h) natively, any other template through the Jinja subset (jinja.h), with the
// tokenizer's bos_token / eos_token and add_generation_prompt as template variables. A template
// the subset cannot parse is refused at load time (unimplemented, naming the construct), so a
// server never renders a wrong prompt; a template that raises (e.g. roles that must alternate)
// fails the render with its message (invalid_argument).
//   FERRY_ASSIGN_OR_RETURN(ChatRenderer r, ChatRenderer::from_tokenizer_config(dir +
//   "/tokenizer_config.json")); FERRY_ASSIGN_OR_RETURN(std::string prompt, r.render(messages,
//   /*add_generation_prompt=*/true));
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/jinja.h"
#include "model/tokenizer/tokenizer.h"

namespace ferry::model {

// bos_token / eos_token of a tokenizer_config.json ("text" or {"content": "text"}; "" when
// absent or null).
struct SpecialTokens {
  std::string bos, eos;
};
Result<SpecialTokens> read_special_tokens(const std::string& tokenizer_config_path);

// The model folder's own end tokens, where transformers' generate stops:
// generation_config.json's eos_token_id (an id or a list) and tokenizer_config.json's eos_token
// (as an id of `tokenizer`), without repeats. Missing or unreadable files add none.
std::vector<TokenId> model_end_token_ids(const std::string& model_dir, const Tokenizer& tokenizer);

class ChatRenderer {
 public:
  static ChatRenderer chatml();
  static Result<ChatRenderer> from_source(std::string_view source, std::string bos_token,
                                          std::string eos_token);
  // chat_template, bos_token and eos_token of a tokenizer_config.json; not_found without a
  // template, corrupt for a malformed file, unimplemented for a template ferry cannot render.
  static Result<ChatRenderer> from_tokenizer_config(const std::string& path);

  Result<std::string> render(std::span<const ChatMessage> messages,
                             bool add_generation_prompt) const;
  // "chatml" or "jinja": which path renders it.
  std::string_view kind() const { return jinja_ ? "jinja" : "chatml"; }

 private:
  std::shared_ptr<const jinja::Template> jinja_;  // null: ChatML
  std::string bos_, eos_;
};

}  // namespace ferry::model
