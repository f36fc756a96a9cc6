// SPDX-License-Identifier: Apache-2.0
#include "serve/http/openai_api.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <tuple>

#include "core/json.h"

namespace ferry::serve::http {
namespace {

bool given(const Json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

Result<bool> boolean(const Json& j, const char* key) {
  if (!j[key].is_boolean()) return invalid_argument("'{}' must be true or false", key);
  return j[key].get<bool>();
}

// An integer field in [lo, hi].
Result<int> integer(const Json& j, const char* key, std::int64_t lo, std::int64_t hi) {
  const Json& v = j[key];
  if (!v.is_number_integer() || v.get<std::int64_t>() < lo || v.get<std::int64_t>() > hi) {
    return invalid_argument("'{}' must be an integer in [{}, {}]", key, lo, hi);
  }
  return static_cast<int>(v.get<std::int64_t>());
}

Status parse_sampling(const Json& j, CompletionParams& p) {
  // max_completion_tokens: the newer chat name of max_tokens (both given: it wins, as OpenAI's).
  // 0 is allowed here and refused below unless a completion echoes and scores its prompt.
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (!given(j, key)) continue;
    FERRY_ASSIGN_OR_RETURN(p.max_tokens, integer(j, key, 0, 1 << 24));
  }
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    const Json& v = j["temperature"];
    if (!v.is_number() || !(v.get<double>() >= 0.0 && v.get<double>() <= 100.0)) {
      return invalid_argument("'temperature' must be a number in [0, 100]");
    }
    p.sampling.temperature = v.get<float>();
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    const Json& v = j["top_p"];
    if (!v.is_number() || !(v.get<double>() > 0.0 && v.get<double>() <= 1.0)) {
      return invalid_argument("'top_p' must be a number in (0, 1]");
    }
    p.sampling.top_p = v.get<float>();
  }
  if (given(j, "min_p")) {  // vLLM and llama.cpp's server extension
    const Json& v = j["min_p"];
    if (!v.is_number() || !(v.get<double>() >= 0.0 && v.get<double>() <= 1.0)) {
      return invalid_argument("'min_p' must be a number in [0, 1]");
    }
    p.sampling.min_p = v.get<float>();
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    const Json& v = j["top_k"];
    // -1 is the vLLM spelling of "no limit".
    if (!v.is_number_integer() || v.get<std::int64_t>() < -1 || v.get<std::int64_t>() > (1 << 24)) {
      return invalid_argument("'top_k' must be an integer >= -1 (-1 or 0: no limit)");
    }
    p.sampling.top_k = static_cast<int>(std::max<std::int64_t>(0, v.get<std::int64_t>()));
  }
  if (j.contains("seed") && !j["seed"].is_null()) {
    const Json& v = j["seed"];
    if (!v.is_number_integer()) return invalid_argument("'seed' must be an integer");
    p.sampling.seed = v.is_number_unsigned() ? v.get<std::uint64_t>()
                                             : static_cast<std::uint64_t>(v.get<std::int64_t>());
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const Json& v = j["stop"];
    if (v.is_string()) {
      p.stop.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      for (const Json& s : v) {
        if (!s.is_string()) return invalid_argument("'stop' must be a string or a list of strings");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      return invalid_argument("'stop' must be a string or a list of strings");
    }
    for (const std::string& s : p.stop) {
      if (s.empty()) return invalid_argument("'stop' strings must not be empty");
    }
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return invalid_argument("'stream' must be true or false");
    p.stream = j["stream"].get<bool>();
  }
  if (j.contains("ignore_eos") && !j["ignore_eos"].is_null()) {
    if (!j["ignore_eos"].is_boolean())
      return invalid_argument("'ignore_eos' must be true or false");
    p.ignore_eos = j["ignore_eos"].get<bool>();
  }
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) return invalid_argument("'model' must be a string");
    p.model = j["model"].get<std::string>();
  }
  // OpenAI's presence / frequency penalties and vLLM's repetition_penalty (logit_penalties.h).
  for (const auto& [key, field, lo, hi] :
       {std::tuple<const char*, float*, double, double>{"presence_penalty",
                                                        &p.sampling.penalties.presence, -2.0, 2.0},
        {"frequency_penalty", &p.sampling.penalties.frequency, -2.0, 2.0},
        {"repetition_penalty", &p.sampling.penalties.repetition, 1e-6, 1e6}}) {
    if (!given(j, key)) continue;
    const Json& v = j[key];
    if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi)) {
      return invalid_argument("'{}' must be a number in [{}, {}]", key, lo, hi);
    }
    *field = v.get<float>();
  }
  // OpenAI's logit_bias: {"token id": bias}; range and vocabulary checked by the engine.
  if (given(j, "logit_bias")) {
    const Json& lb = j["logit_bias"];
    if (!lb.is_object()) return invalid_argument("'logit_bias' must be an object of id: bias");
    for (const auto& [key, v] : lb.items()) {
      char* end = nullptr;
      const long id = std::strtol(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id > std::numeric_limits<std::int32_t>::max()) {
        return invalid_argument("'logit_bias' keys must be token ids, got '{}'", key);
      }
      if (!v.is_number() || !(v.get<double>() >= -100.0 && v.get<double>() <= 100.0)) {
        return invalid_argument("'logit_bias' values must be numbers in [-100, 100]");
      }
      p.sampling.penalties.logit_bias.emplace_back(static_cast<std::int32_t>(id), v.get<float>());
    }
  }
  // vLLM's stop_token_ids: generation also stops at these ids.
  if (given(j, "stop_token_ids")) {
    const Json& v = j["stop_token_ids"];
    if (!v.is_array()) return invalid_argument("'stop_token_ids' must be a list of token ids");
    for (const Json& t : v) {
      if (!t.is_number_integer() || t.get<std::int64_t>() < 0 ||
          t.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max()) {
        return invalid_argument("'stop_token_ids' must be a list of token ids");
      }
      p.stop_token_ids.push_back(static_cast<std::int32_t>(t.get<std::int64_t>()));
    }
  }
  if (given(j, "stream_options")) {
    const Json& so = j["stream_options"];
    if (!p.stream) return invalid_argument("'stream_options' is only allowed with 'stream': true");
    if (!so.is_object()) return invalid_argument("'stream_options' must be an object");
    if (given(so, "include_usage")) {
      FERRY_ASSIGN_OR_RETURN(p.include_usage, boolean(so, "include_usage"));
    }
  }
  return ok_status();
}

// A message's content: a string, null (an assistant turn with nothing to say), or OpenAI's list
// of parts, whose "text" parts are joined with newlines (as vLLM joins them); other part types
// (images, audio) are refused: the models served here read text only.
Result<std::string> message_content(const Json& c) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return std::string();
  if (!c.is_array())
    return invalid_argument("a message's 'content' must be a string or a list of parts");
  std::string out;
  bool first = true;
  for (const Json& part : c) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return invalid_argument("each content part needs a string 'type'");
    }
    const std::string type = part["type"].get<std::string>();
    if (type != "text") {
      return invalid_argument("content parts of type '{}' are not supported (text only)", type);
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return invalid_argument("a text content part needs a string 'text'");
    }
    if (!first) out += '\n';
    out += part["text"].get<std::string>();
    first = false;
  }
  return out;
}

// completions: "logprobs": n, "echo"; chat: "logprobs": true, "top_logprobs": n.
Status parse_logprobs(const Json& j, CompletionParams& p) {
  if (p.chat) {
    if (given(j, "echo")) return invalid_argument("'echo' is a /v1/completions field");
    bool on = false;
    if (given(j, "logprobs")) {
      FERRY_ASSIGN_OR_RETURN(on, boolean(j, "logprobs"));
    }
    if (given(j, "top_logprobs")) {
      if (!on) return invalid_argument("'top_logprobs' needs 'logprobs': true");
      FERRY_ASSIGN_OR_RETURN(p.logprobs, integer(j, "top_logprobs", 0, kMaxTopLogprobs));
    } else if (on) {
      p.logprobs = 0;
    }
  } else {
    if (given(j, "logprobs")) {
      FERRY_ASSIGN_OR_RETURN(p.logprobs, integer(j, "logprobs", 0, kMaxTopLogprobs));
    }
    if (given(j, "echo")) {
      FERRY_ASSIGN_OR_RETURN(p.echo, boolean(j, "echo"));
    }
  }
  if (p.echo && p.stream) {
    return invalid_argument("'echo' is supported for non-streamed completions only");
  }
  if (p.max_tokens == 0 && !(p.echo && p.logprobs >= 0)) {
    return invalid_argument(
        "'max_tokens' must be at least 1 (0 only with 'echo': true and 'logprobs', to score the "
        "prompt)");
  }
  return ok_status();
}

}  // namespace

Result<CompletionParams> parse_completion_request(std::string_view body, bool chat,
                                                  int default_max_tokens) {
  const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("the request body is not valid JSON");
  if (!j.is_object()) return invalid_argument("the request body must be a JSON object");
  CompletionParams p;
  p.chat = chat;
  p.max_tokens = default_max_tokens;
  if (chat) {
    if (!j.contains("messages")) return invalid_argument("missing required field 'messages'");
    const Json& m = j["messages"];
    if (!m.is_array() || m.empty()) {
      return invalid_argument("'messages' must be a non-empty list");
    }
    for (const Json& msg : m) {
      if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string() ||
          !msg.contains("content")) {
        return invalid_argument("each message needs a string 'role' and a 'content'");
      }
      FERRY_ASSIGN_OR_RETURN(std::string content, message_content(msg["content"]));
      p.messages.push_back({msg["role"].get<std::string>(), std::move(content)});
    }
  } else {
    if (!j.contains("prompt")) return invalid_argument("missing required field 'prompt'");
    const Json& pr = j["prompt"];
    // One prompt (a string or a list of ids) or a batch of them (a list of strings or of id
    // lists; OpenAI's batched completions, as lm-evaluation-harness sends them).
    auto ids_of = [](const Json& a, std::vector<std::int32_t>& out) -> Status {
      if (a.empty()) return invalid_argument("'prompt' token-id lists must not be empty");
      for (const Json& id : a) {
        if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
            id.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max()) {
          return invalid_argument("'prompt' as a list must hold non-negative token ids");
        }
        out.push_back(static_cast<std::int32_t>(id.get<std::int64_t>()));
      }
      return ok_status();
    };
    auto text_of = [](const Json& t, PromptInput& out) -> Status {
      out.text = t.get<std::string>();
      if (out.text->empty()) return invalid_argument("'prompt' must not be empty");
      return ok_status();
    };
    const bool batch = pr.is_array() && !pr.empty() && (pr[0].is_string() || pr[0].is_array());
    if (pr.is_string()) {
      FERRY_TRY(text_of(pr, p.prompts.emplace_back()));
    } else if (batch) {
      if (pr.size() > kMaxPromptsPerRequest) {
        return invalid_argument("'prompt' batches hold at most {} prompts", kMaxPromptsPerRequest);
      }
      for (const Json& one : pr) {
        if (one.is_string()) {
          FERRY_TRY(text_of(one, p.prompts.emplace_back()));
        } else if (one.is_array()) {
          FERRY_TRY(ids_of(one, p.prompts.emplace_back().ids));
        } else {
          return invalid_argument("a 'prompt' batch holds strings or lists of token ids");
        }
      }
    } else if (pr.is_array() && !pr.empty()) {
      FERRY_TRY(ids_of(pr, p.prompts.emplace_back().ids));
    } else {
      return invalid_argument("'prompt' must be a string or a non-empty list of token ids");
    }
  }
  if (given(j, "n")) {
    FERRY_ASSIGN_OR_RETURN(p.n, integer(j, "n", 1, kMaxChoicesPerRequest));
  }
  const std::size_t prompts = chat ? 1 : p.prompts.size();
  if (prompts * std::size_t(p.n) > std::size_t(kMaxChoicesPerRequest)) {
    return invalid_argument("{} prompts x n = {} choices; at most {} per request", prompts, p.n,
                            kMaxChoicesPerRequest);
  }
  FERRY_TRY(parse_sampling(j, p));
  FERRY_TRY(parse_logprobs(j, p));
  return p;
}

std::size_t append_utf8_sanitized(std::string_view b, std::size_t from, bool final,
                                  std::string& out) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::size_t i = from;
  while (i < b.size()) {
    const auto c = static_cast<unsigned char>(b[i]);
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    int len = 0;
    std::uint32_t cp = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07;
    }
    if (len == 0) {  // a continuation byte or an invalid lead
      out += kReplacement;
      ++i;
      continue;
    }
    bool bad = false, incomplete = false;
    for (int k = 1; k < len; ++k) {
      if (i + k >= b.size()) {
        incomplete = true;
        break;
      }
      const auto d = static_cast<unsigned char>(b[i + k]);
      if ((d & 0xC0) != 0x80) {
        bad = true;
        break;
      }
      cp = (cp << 6) | (d & 0x3F);
      // Reject overlong forms, surrogates and > U+10FFFF as soon as the second byte shows them.
      if (k == 1) {
        if ((c == 0xE0 && d < 0xA0) || (c == 0xED && d > 0x9F) || (c == 0xF0 && d < 0x90) ||
            (c == 0xF4 && d > 0x8F)) {
          bad = true;
          break;
        }
      }
    }
    if (incomplete && !bad) {
      if (!final) return i;  // wait for the rest of the sequence
      out += kReplacement;
      ++i;
      continue;
    }
    if (bad) {
      out += kReplacement;
      ++i;
      continue;
    }
    out.append(b.substr(i, static_cast<std::size_t>(len)));
    i += static_cast<std::size_t>(len);
  }
  return i;
}

}  // namespace ferry::serve::http
