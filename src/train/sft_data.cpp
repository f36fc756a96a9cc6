// SPDX-License-Identifier: Apache-2.0
#include "train/sft_data.h"

#include <fstream>

#include "core/json.h"
#include "core/log.h"

namespace ferry::train {

std::int64_t TokenizedExample::trained() const {
  std::int64_t n = 0;
  for (std::int32_t t : targets) n += t != kIgnoreTarget;
  return n;
}

namespace {

Result<std::string> string_field(const Json& obj, const char* key, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end()) return invalid_argument("{}: missing \"{}\"", where, key);
  if (!it->is_string()) return invalid_argument("{}: \"{}\" must be a string", where, key);
  return it->get<std::string>();
}

}  // namespace

Result<SftExample> parse_sft_record(std::string_view line, const std::string& where) {
  auto parsed = parse_json(line, where);
  if (!parsed.ok()) return invalid_argument("{}: not valid JSON", where);
  const Json& j = *parsed;
  if (!j.is_object()) return invalid_argument("{}: a record must be a JSON object", where);
  SftExample ex;
  if (j.contains("messages")) {
    const Json& msgs = j["messages"];
    if (!msgs.is_array() || msgs.empty()) {
      return invalid_argument("{}: \"messages\" must be a non-empty array", where);
    }
    bool has_assistant = false;
    for (std::size_t i = 0; i < msgs.size(); ++i) {
      if (!msgs[i].is_object()) {
        return invalid_argument("{}: messages[{}] must be an object", where, i);
      }
      const std::string w = fmt::format("{}: messages[{}]", where, i);
      FERRY_ASSIGN_OR_RETURN(std::string role, string_field(msgs[i], "role", w));
      FERRY_ASSIGN_OR_RETURN(std::string content, string_field(msgs[i], "content", w));
      if (role.empty()) return invalid_argument("{}: empty role", w);
      has_assistant = has_assistant || role == "assistant";
      ex.messages.push_back({std::move(role), std::move(content)});
    }
    if (!has_assistant) return invalid_argument("{}: no assistant message to train on", where);
    return ex;
  }
  if (j.contains("prompt") || j.contains("response")) {
    FERRY_ASSIGN_OR_RETURN(std::string prompt, string_field(j, "prompt", where));
    FERRY_ASSIGN_OR_RETURN(std::string response, string_field(j, "response", where));
    ex.messages.push_back({"user", std::move(prompt)});
    ex.messages.push_back({"assistant", std::move(response)});
    return ex;
  }
  return invalid_argument("{}: expected \"prompt\"/\"response\" or \"messages\"", where);
}

Result<std::vector<SftExample>> read_sft_jsonl(const std::string& path, bool strict,
                                               DataReport* report) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("train: cannot open data file {}", path);
  std::vector<SftExample> out;
  std::string line;
  std::int64_t lineno = 0;
  auto logger = log::get("train");
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    ++report->lines;
    auto ex = parse_sft_record(line, fmt::format("{}:{}", path, lineno));
    if (!ex.ok()) {
      if (strict) return invalid_argument("train: {} (--strict)", ex.status().message());
      ++report->malformed;
      if (report->first_errors.size() < 10) {
        report->first_errors.push_back(ex.status().message());
        logger->warn("skipping malformed line: {}", ex.status().message());
      }
      continue;
    }
    out.push_back(std::move(ex).value());
  }
  if (in.bad()) return io_error("train: read error in {}", path);
  if (out.empty()) {
    return invalid_argument("train: {} has no valid examples ({} lines, {} malformed)", path,
                            report->lines, report->malformed);
  }
  return out;
}

Result<TokenizedExample> tokenize_example(const model::Tokenizer& tok, const SftExample& ex) {
  const model::TokenId im_start = tok.token_to_id("<|im_start|>");
  const model::TokenId im_end = tok.token_to_id("<|im_end|>");
  if (im_start < 0 || im_end < 0) {
    return invalid_argument("train: the tokenizer has no <|im_start|>/<|im_end|> (ChatML) tokens");
  }
  std::size_t last_assistant = ex.messages.size();
  for (std::size_t i = 0; i < ex.messages.size(); ++i) {
    if (ex.messages[i].role == "assistant") last_assistant = i;
  }
  if (last_assistant == ex.messages.size()) {
    return invalid_argument("train: example has no assistant message");
  }
  TokenizedExample out;
  std::vector<bool> trained;  // [n]: token is a target
  auto append = [&](std::span<const model::TokenId> ids, bool train) {
    for (model::TokenId id : ids) {
      out.ids.push_back(id);
      trained.push_back(train);
    }
  };
  FERRY_ASSIGN_OR_RETURN(const std::vector<model::TokenId> newline, tok.encode("\n"));
  for (std::size_t i = 0; i < ex.messages.size(); ++i) {
    const model::ChatMessage& m = ex.messages[i];
    const bool train = m.role == "assistant";
    const model::TokenId start[] = {im_start};
    append(start, false);
    FERRY_ASSIGN_OR_RETURN(const auto header, tok.encode(m.role + "\n"));
    append(header, false);
    if (i == last_assistant) {
      out.prompt_len = static_cast<std::int64_t>(out.ids.size());
      out.answer = m.content;
    }
    FERRY_ASSIGN_OR_RETURN(const auto content, tok.encode(m.content));
    append(content, train);
    const model::TokenId end[] = {im_end};
    append(end, train);
    if (i + 1 < ex.messages.size()) append(newline, false);
  }
  out.targets.assign(out.ids.size(), kIgnoreTarget);
  for (std::size_t t = 0; t + 1 < out.ids.size(); ++t) {
    if (trained[t + 1]) out.targets[t] = out.ids[t + 1];
  }
  return out;
}

Result<std::vector<TokenizedExample>> tokenize_dataset(const model::Tokenizer& tok,
                                                       const std::vector<SftExample>& examples,
                                                       std::int64_t seq_len,
                                                       OverlongPolicy overlong,
                                                       DataReport* report) {
  std::vector<TokenizedExample> out;
  out.reserve(examples.size());
  for (const SftExample& ex : examples) {
    FERRY_ASSIGN_OR_RETURN(TokenizedExample t, tokenize_example(tok, ex));
    if (static_cast<std::int64_t>(t.ids.size()) > seq_len) {
      if (overlong == OverlongPolicy::kSkip) {
        ++report->skipped;
        continue;
      }
      t.ids.resize(static_cast<std::size_t>(seq_len));
      t.targets.resize(static_cast<std::size_t>(seq_len));
      t.targets.back() = kIgnoreTarget;  // its next token was cut off
      ++report->truncated;
    }
    if (t.trained() == 0) {
      ++report->skipped;  // truncation removed every trained token
      continue;
    }
    out.push_back(std::move(t));
  }
  report->examples = static_cast<std::int64_t>(out.size());
  if (out.empty()) {
    return invalid_argument(
        "train: no example left after applying --seq-len {} ({} skipped, {} truncated)", seq_len,
        report->skipped, report->truncated);
  }
  return out;
}

}  // namespace ferry::train
