// SPDX-License-Identifier: Apache-2.0
// POST /v1/completions and /v1/chat/completions (http_server.h). Flow: parse (openai_api.h) ->
// one engine request per choice (each prompt of a batch, n times; choice k = prompt k / n,
// sample k % n) -> wait on every choice's channel and answer with all choices, or stream them as
// SSE chunks, each chunk one choice's delta with its "index". Choices of one request are
// submitted together, so they run side by side in the engine's continuous batching.
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "serve/http/connection_probe.h"
#include "serve/http/logprobs_json.h"
#include "serve/http/openai_api.h"
#include "serve/http/server_impl.h"

namespace ferry::serve::http {
namespace {

// One prompt of the request: its ids, and with echo its text.
struct PromptPlan {
  std::vector<std::int32_t> ids;
  std::string echo_text;
};

// One choice: its engine request and, when streamed, what has been sent so far.
struct Choice {
  std::size_t prompt = 0;  // index into the request's prompts
  EngineWorker::Submitted sub;
  std::optional<Result<RequestOutput>> output;  // set once finished
  std::size_t seen = 0;                         // tokens seen
  std::size_t sent_bytes = 0;                   // bytes of the detokenized text already sent
  bool role_sent = false;
  std::optional<LogprobsJson> logprobs;  // streamed with logprobs: entries not yet sent
};

// The state a streamed response's provider keeps between calls.
struct Stream {
  std::vector<Choice> choices;
  std::size_t hold_back = 0;  // longest stop string - 1: text that may still be cut
  std::size_t prompt_tokens = 0, completion_tokens = 0;
  bool include_usage = false, finished = false;
};

// Cancels in the engine every choice that has not finished (the client went away, or the
// request failed as a whole).
void cancel_unfinished(EngineWorker& worker, const std::vector<Choice>& choices) {
  for (const Choice& c : choices) {
    if (!c.output) worker.cancel(c.sub.id);
  }
}

// The choice object: the whole text, or one streamed delta.
Json choice_json(bool chat, std::size_t index, const std::string& text, const Json& finish,
                 bool stream, bool role, const Json& logprobs) {
  Json c = {{"index", index}, {"finish_reason", finish}, {"logprobs", logprobs}};
  if (!chat) {
    c["text"] = text;
  } else if (stream) {
    c["delta"] = Json::object();
    if (role) c["delta"]["role"] = "assistant";
    c["delta"]["content"] = text;
  } else {
    c["message"] = {{"role", "assistant"}, {"content", text}};
  }
  return c;
}

Json usage_json(std::size_t prompt_tokens, std::size_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

// Bytes of the U+FFFD characters (at most 3: an incomplete sequence has at most 3 bytes) that
// end `text`.
std::size_t trailing_replacement_bytes(std::string_view text) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::size_t n = 0;
  while (n < 3 * kReplacement.size() && text.size() >= n + kReplacement.size() &&
         text.substr(text.size() - n - kReplacement.size(), kReplacement.size()) == kReplacement) {
    n += kReplacement.size();
  }
  return n;
}

bool client_fault(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kOutOfRange ||
         s.code() == StatusCode::kResourceExhausted;
}

}  // namespace

void HttpServer::Impl::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  Result<CompletionParams> parsed =
      parse_completion_request(req.body, chat, cfg.default_max_tokens);
  if (!parsed.ok()) return client_error(res, parsed.status().message());
  const CompletionParams& p = *parsed;
  if (!p.model.empty() && p.model != cfg.model_name) {
    ++metrics.requests_client_error;
    return send_error(
        res, 404, "invalid_request_error",
        "model '" + p.model + "' does not exist; this server runs '" + cfg.model_name + "'");
  }
  // The prompts as ids (and their echo text).
  std::vector<PromptPlan> prompts;
  auto encode = [&](const std::string& text) -> Result<std::vector<std::int32_t>> {
    if (!tokenizer) return invalid_argument("this model has no tokenizer; send token ids");
    FERRY_ASSIGN_OR_RETURN(std::vector<model::TokenId> ids, tokenizer->encode(text));
    return std::vector<std::int32_t>(ids.begin(), ids.end());
  };
  if (chat) {
    if (!cfg.chat_refusal.empty()) return client_error(res, cfg.chat_refusal);
    Result<std::string> text = render_chat(p.messages);  // a template's raise_exception: 400
    if (!text.ok()) return client_error(res, text.status().message());
    Result<std::vector<std::int32_t>> ids = encode(*text);
    if (!ids.ok()) return client_error(res, ids.status().message());
    prompts.push_back({.ids = std::move(*ids)});
  } else {
    for (const PromptInput& in : p.prompts) {
      PromptPlan& plan = prompts.emplace_back();
      if (in.text) {
        Result<std::vector<std::int32_t>> ids = encode(*in.text);
        if (!ids.ok()) return client_error(res, ids.status().message());
        plan.ids = std::move(*ids);
        if (p.echo) plan.echo_text = *in.text;
      } else {
        plan.ids = in.ids;
        if (p.echo && tokenizer) {
          Result<std::string> t = tokenizer->decode(plan.ids);
          if (t.ok()) plan.echo_text = std::move(*t);
        }
      }
    }
  }
  if (!tokenizer && !p.stop.empty()) return client_error(res, "'stop' needs a tokenizer");

  // One engine request per choice, all submitted before any is waited on.
  auto st = std::make_shared<Stream>();
  std::vector<Choice>& choices = st->choices;
  for (std::size_t k = 0; k < prompts.size(); ++k) {
    st->prompt_tokens += prompts[k].ids.size();
    for (int j = 0; j < p.n; ++j) {
      GenerationRequest g;
      g.prompt = prompts[k].ids;
      g.sampling = p.sampling;
      // A given seed seeds sample j with seed + j: the choices differ and each is reproducible
      // (n = 1 runs the seed itself). Unset: the engine derives one per request.
      if (p.sampling.seed) g.sampling.seed = *p.sampling.seed + std::uint64_t(j);
      g.max_new_tokens = p.max_tokens;
      g.stop_strings = p.stop;
      if (!p.ignore_eos) g.stop_token_ids = stop_ids;
      g.stop_token_ids.insert(g.stop_token_ids.end(), p.stop_token_ids.begin(),
                              p.stop_token_ids.end());
      g.logprobs = p.logprobs;
      if (p.echo && p.logprobs >= 0) g.prompt_logprobs = p.logprobs;
      if (tokenizer) {
        g.detokenize = [this](std::span<const std::int32_t> ids) { return detokenize(ids); };
      }
      Result<EngineWorker::Submitted> sub = worker.submit(std::move(g));
      if (!sub.ok()) {
        cancel_unfinished(worker, choices);  // the request fails whole
        ++(client_fault(sub.status()) ? metrics.requests_client_error
                                      : metrics.requests_server_error);
        return send_status(res, sub.status());
      }
      Choice& c = choices.emplace_back();
      c.prompt = k;
      c.sub = std::move(*sub);
      if (p.stream && p.logprobs >= 0) c.logprobs.emplace(tokenizer, chat);
    }
  }
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(choices.front().sub.id);
  const std::int64_t created = unix_now();
  const std::string object = p.stream ? (chat ? "chat.completion.chunk" : "text_completion")
                             : chat   ? "chat.completion"
                                      : "text_completion";
  auto envelope = [=, this](Json choices_json) {
    return Json{{"id", id},
                {"object", object},
                {"created", created},
                {"model", cfg.model_name},
                {"choices", std::move(choices_json)}};
  };

  if (!p.stream) {
    // A client that goes away while its answer is computed has its choices cancelled (the
    // streamed path notices at its next write; this one polls the connection).
    const ConnectionProbe probe =
        ConnectionProbe::find(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
    bool client_gone = false;
    for (;;) {
      bool waited = false, all = true;
      for (Choice& c : choices) {
        if (c.output) continue;
        // Block (poll_ms) on the first unfinished choice only; look at the others.
        RequestChannel::Snapshot snap =
            c.sub.channel->wait(c.seen, std::chrono::milliseconds(waited ? 0 : cfg.poll_ms));
        waited = true;
        c.seen = snap.tokens.size();
        if (snap.output) {
          c.output = std::move(snap.output);
        } else {
          all = false;
        }
      }
      if (all) break;
      if (!client_gone && probe.peer_gone()) {
        client_gone = true;
        cancel_unfinished(worker, choices);
      }
    }
    if (client_gone) {  // nobody reads the answer
      ++metrics.requests_cancelled;
      res.status = 499;  // nginx's "client closed request"; never seen by the client
      return;
    }
    Json out_choices = Json::array();
    std::size_t completion_tokens = 0;
    bool cancelled = false;
    for (std::size_t i = 0; i < choices.size(); ++i) {
      const Choice& c = choices[i];
      if (!c.output->ok()) {
        ++metrics.requests_server_error;
        return send_status(res, c.output->status());
      }
      const RequestOutput& out = **c.output;
      const PromptPlan& pr = prompts[c.prompt];
      std::string text;
      append_utf8_sanitized(pr.echo_text + out.text, 0, /*final=*/true, text);
      Json logprobs = nullptr;
      if (p.logprobs >= 0) {
        LogprobsJson lj(tokenizer, chat);
        if (p.echo) {
          for (std::size_t t = 0; t < pr.ids.size(); ++t) {
            const bool have = t > 0 && t - 1 < out.prompt_logprobs.size();
            lj.add(pr.ids[t], have ? &out.prompt_logprobs[t - 1] : nullptr);
          }
        }
        for (std::size_t t = 0; t < out.tokens.size(); ++t) {
          lj.add(out.tokens[t], t < out.logprobs.size() ? &out.logprobs[t] : nullptr);
        }
        logprobs = lj.take();
      }
      cancelled = cancelled || out.finish == FinishReason::kCancelled;
      completion_tokens += out.tokens.size();
      out_choices.push_back(
          choice_json(chat, i, text, finish_reason(out.finish), false, false, logprobs));
    }
    ++(cancelled ? metrics.requests_cancelled : metrics.requests_ok);
    Json body = envelope(std::move(out_choices));
    body["usage"] = usage_json(st->prompt_tokens, completion_tokens);
    res.set_content(dump(body), "application/json");
    return;
  }

  for (const std::string& s : p.stop) st->hold_back = std::max(st->hold_back, s.size() - 1);
  st->include_usage = p.include_usage;
  // A chunk: choice i's text delta and the logprobs of its tokens not yet sent.
  auto event = [st, chat, envelope](std::size_t i, const std::string& text, const Json& finish,
                                    bool role) {
    Choice& c = st->choices[i];
    const Json lp = c.logprobs && !c.logprobs->empty() ? c.logprobs->take() : Json(nullptr);
    return "data: " +
           dump(envelope(Json::array({choice_json(chat, i, text, finish, true, role, lp)}))) +
           "\n\n";
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, event, envelope, chat](std::size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        auto gone = [&] {  // the client went away: cancel in the engine, end this response
          cancel_unfinished(worker, st->choices);
          return false;
        };
        bool waited = false, all = true;
        for (std::size_t i = 0; i < st->choices.size(); ++i) {
          Choice& c = st->choices[i];
          if (c.output) continue;
          if (chat && !c.role_sent) {
            c.role_sent = true;
            if (!write(event(i, "", nullptr, true))) return gone();
          }
          RequestChannel::Snapshot snap =
              c.sub.channel->wait(c.seen, std::chrono::milliseconds(waited ? 0 : cfg.poll_ms));
          waited = true;
          if (snap.output && !snap.output->ok()) {
            ++metrics.requests_server_error;
            st->finished = true;
            c.output = std::move(snap.output);  // this one is over; the others are cancelled
            cancel_unfinished(worker, st->choices);
            const Json err = {
                {"error", {{"message", c.output->status().message()}, {"type", "server_error"}}}};
            write("data: " + dump(err) + "\n\n");
            write("data: [DONE]\n\n");
            sink.done();
            return true;
          }
          std::string delta;
          if (snap.output) {
            const std::string& final_text = (*snap.output)->text;
            if (final_text.size() >= c.sent_bytes) {
              c.sent_bytes = append_utf8_sanitized(final_text, c.sent_bytes, true, delta);
            }
          } else if (snap.tokens.size() > c.seen && tokenizer) {
            Result<std::string> bytes = detokenize(snap.tokens);
            if (bytes.ok() && bytes->size() > st->hold_back + c.sent_bytes) {
              std::string_view safe(bytes->data(), bytes->size() - st->hold_back);
              // decode() repairs a character cut at the end (its bytes still to come) into
              // U+FFFD: hold such a tail back until the next token completes it (or the final
              // text, which is the same decoding, has it).
              safe.remove_suffix(trailing_replacement_bytes(safe));
              if (safe.size() > c.sent_bytes) {
                c.sent_bytes = append_utf8_sanitized(safe, c.sent_bytes, false, delta);
              }
            }
          }
          if (c.logprobs) {  // snap.logprobs are those of tokens[c.seen..]
            for (std::size_t k = 0; k < snap.logprobs.size(); ++k) {
              c.logprobs->add(snap.tokens[c.seen + k], &snap.logprobs[k]);
            }
          }
          c.seen = snap.tokens.size();
          const bool new_logprobs = c.logprobs && !c.logprobs->empty();
          if ((!delta.empty() || (new_logprobs && !snap.output)) &&
              !write(event(i, delta, nullptr, false))) {
            return gone();
          }
          if (!snap.output) {
            all = false;
            continue;
          }
          const RequestOutput& out = **snap.output;
          st->completion_tokens += out.tokens.size();
          c.output = std::move(snap.output);
          if (!write(event(i, "", finish_reason(out.finish), false))) return gone();
        }
        if (!all) return true;
        st->finished = true;
        bool cancelled = false;
        for (const Choice& c : st->choices) {
          cancelled = cancelled || (*c.output)->finish == FinishReason::kCancelled;
        }
        ++(cancelled ? metrics.requests_cancelled : metrics.requests_ok);
        if (st->include_usage) {  // the last chunk before [DONE]: no choices, the usage
          Json u = envelope(Json::array());
          u["usage"] = usage_json(st->prompt_tokens, st->completion_tokens);
          if (!write("data: " + dump(u) + "\n\n")) return false;
        }
        if (!write("data: [DONE]\n\n")) return false;
        sink.done();
        return true;
      },
      [this, st](bool /*success*/) {
        if (!st->finished) {  // ended before the engine finished it: the client went away
          cancel_unfinished(worker, st->choices);
          ++metrics.requests_cancelled;
          st->finished = true;
        }
      });
}

}  // namespace ferry::serve::http
