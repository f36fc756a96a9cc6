// SPDX-License-Identifier: Apache-2.0
#include "serve/http/logprobs_json.h"

#include "serve/http/openai_api.h"

namespace ferry::serve::http {

LogprobsJson::LogprobsJson(const model::Tokenizer* tokenizer, bool chat)
    : tok_(tokenizer), chat_(chat) {
  take();
}

LogprobsJson::Piece LogprobsJson::piece(std::int32_t token) const {
  Piece p;
  if (tok_ == nullptr) {
    p.text = "token_id:" + std::to_string(token);
    return p;
  }
  Result<std::string> raw = tok_->token_bytes(token);
  if (!raw.ok()) {  // an id the model has but the tokenizer lacks (padded vocabularies)
    p.text = "token_id:" + std::to_string(token);
    return p;
  }
  p.bytes = std::move(*raw);
  append_utf8_sanitized(p.bytes, 0, /*final=*/true, p.text);
  p.shown_bytes = tok_->is_special(token) ? 0 : p.bytes.size();
  return p;
}

Json LogprobsJson::bytes_json(const std::string& raw) const {
  Json a = Json::array();
  for (const char c : raw) a.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return a;
}

void LogprobsJson::add(std::int32_t token, const TokenLogprob* lp) {
  ++count_;
  const Piece p = piece(token);
  if (chat_) {
    Json e = {{"token", p.text},
              {"logprob", lp ? Json(lp->logprob) : Json(nullptr)},
              {"bytes", bytes_json(p.bytes)},
              {"top_logprobs", Json::array()}};
    if (lp) {
      for (const auto& [id, x] : lp->top) {
        const Piece t = piece(id);
        e["top_logprobs"].push_back(
            {{"token", t.text}, {"logprob", x}, {"bytes", bytes_json(t.bytes)}});
      }
    }
    content_.push_back(std::move(e));
    return;
  }
  tokens_.push_back(p.text);
  text_offset_.push_back(offset_);
  offset_ += p.shown_bytes;
  if (lp == nullptr) {
    token_logprobs_.push_back(nullptr);
    top_logprobs_.push_back(nullptr);
    return;
  }
  token_logprobs_.push_back(lp->logprob);
  Json top = Json::object();
  for (const auto& [id, x] : lp->top) top[piece(id).text] = x;
  top[p.text] = lp->logprob;  // the chosen token is always listed
  top_logprobs_.push_back(std::move(top));
}

Json LogprobsJson::take() {
  Json out;
  if (chat_) {
    out = {{"content", content_}};
  } else {
    out = {{"tokens", tokens_},
           {"token_logprobs", token_logprobs_},
           {"top_logprobs", top_logprobs_},
           {"text_offset", text_offset_}};
  }
  tokens_ = token_logprobs_ = top_logprobs_ = text_offset_ = content_ = Json::array();
  count_ = 0;
  return out;
}

}  // namespace ferry::serve::http
