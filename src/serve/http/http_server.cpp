// SPDX-License-Identifier: Apache-2.0
// See http_server.h. Handler flow: parse (openai_api.h) -> prompt ids -> EngineWorker::submit ->
// wait on the request's channel (whole answer) or stream its tokens as SSE chunks.
#include "serve/http/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <exception>
#include <limits>
#include <optional>
#include <thread>

#include "core/json.h"
#include "core/log.h"
#include "serve/http/connection_probe.h"
#include "serve/http/engine_worker.h"
#include "serve/http/logprobs_json.h"
#include "serve/http/openai_api.h"

namespace ferry::serve::http {
namespace {

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

void send_error(httplib::Response& res, int status, const std::string& type,
                const std::string& message) {
  res.status = status;
  res.set_content(dump({{"error", {{"message", message}, {"type", type}}}}), "application/json");
}

// An engine/worker Status as an HTTP error: the caller's fault is 400, the rest 5xx.
void send_status(httplib::Response& res, const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kResourceExhausted:
      send_error(res, 400, "invalid_request_error", s.message());
      break;
    case StatusCode::kUnavailable:
    case StatusCode::kCancelled:
      send_error(res, 503, "unavailable", s.message());
      break;
    default:
      send_error(res, 500, "server_error", s.message());
  }
}

std::string_view finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    default:
      return "stop";
  }
}

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::vector<std::int32_t> default_stop_ids(const model::Tokenizer& tokenizer) {
  std::vector<std::int32_t> ids;
  for (const char* t : {"<|im_end|>", "<|endoftext|>"}) {
    const std::int32_t id = tokenizer.token_to_id(t);
    if (id >= 0) ids.push_back(id);
  }
  return ids;
}

struct HttpServer::Impl {
  Impl(Engine& e, const model::Tokenizer* t, HttpServerConfig c)
      : engine(e), tokenizer(t), cfg(std::move(c)), worker(e, &metrics) {
    if (tokenizer) stop_ids = default_stop_ids(*tokenizer);
  }

  Engine& engine;
  const model::Tokenizer* tokenizer;
  HttpServerConfig cfg;
  ServerMetrics metrics;  // before the worker, which points at it
  EngineWorker worker;
  std::vector<std::int32_t> stop_ids;
  httplib::Server http;
  std::thread listener;
  std::shared_ptr<std::atomic<bool>> exited = std::make_shared<std::atomic<bool>>(false);
  bool stopped = false;

  void routes();
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize_route(const httplib::Request& req, httplib::Response& res);
  // 400 with the message; counted as a client error.
  void client_error(httplib::Response& res, const std::string& message) {
    ++metrics.requests_client_error;
    send_error(res, 400, "invalid_request_error", message);
  }
  Result<std::string> detokenize(std::span<const std::int32_t> ids) const {
    return tokenizer->decode(ids, {.skip_special_tokens = true});
  }
};

namespace {

// One streamed request: what has been sent so far.
struct StreamState {
  EngineWorker::Submitted sub;
  std::size_t seen = 0;        // tokens seen
  std::size_t sent_bytes = 0;  // bytes of the detokenized text already sent
  std::size_t hold_back = 0;   // longest stop string - 1: text that may still be cut
  bool role_sent = false, finished = false;
  std::optional<LogprobsJson> logprobs;  // when asked for: the entries not yet sent
  std::size_t logprobs_seen = 0;         // tokens whose entries were added
  std::size_t prompt_tokens = 0;
  bool include_usage = false;
};

Json usage_json(std::size_t prompt_tokens, std::size_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

}  // namespace

void HttpServer::Impl::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  Result<CompletionParams> parsed =
      parse_completion_request(req.body, chat, cfg.default_max_tokens);
  if (!parsed.ok()) {
    ++metrics.requests_client_error;
    return send_error(res, 400, "invalid_request_error", parsed.status().message());
  }
  const CompletionParams& p = *parsed;
  if (!p.model.empty() && p.model != cfg.model_name) {
    ++metrics.requests_client_error;
    return send_error(
        res, 404, "invalid_request_error",
        "model '" + p.model + "' does not exist; this server runs '" + cfg.model_name + "'");
  }
  GenerationRequest g;
  if (!p.prompt_ids.empty()) {
    g.prompt = p.prompt_ids;
  } else {
    if (!tokenizer) {
      ++metrics.requests_client_error;
      return send_error(res, 400, "invalid_request_error",
                        "this model has no tokenizer; send 'prompt' as token ids");
    }
    const std::string text = chat ? model::render_chatml(p.messages, true) : *p.prompt;
    Result<std::vector<model::TokenId>> ids = tokenizer->encode(text);
    if (!ids.ok()) {
      ++metrics.requests_client_error;
      return send_error(res, 400, "invalid_request_error", ids.status().message());
    }
    g.prompt.assign(ids->begin(), ids->end());
  }
  const std::size_t prompt_tokens = g.prompt.size();
  g.sampling = p.sampling;
  g.max_new_tokens = p.max_tokens;
  g.logprobs = p.logprobs;
  // echo: the prompt's text in front of the answer, and with logprobs its tokens' logprobs.
  std::string echo_text;
  std::vector<std::int32_t> echo_ids;
  if (p.echo) {
    if (p.logprobs >= 0) g.prompt_logprobs = p.logprobs;
    echo_ids = g.prompt;
    if (p.prompt) {
      echo_text = *p.prompt;
    } else if (tokenizer) {
      Result<std::string> t = tokenizer->decode(g.prompt);
      if (t.ok()) echo_text = std::move(*t);
    }
  }
  g.stop_strings = p.stop;
  if (!p.ignore_eos) g.stop_token_ids = stop_ids;
  g.stop_token_ids.insert(g.stop_token_ids.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  if (tokenizer) {
    g.detokenize = [this](std::span<const std::int32_t> ids) { return detokenize(ids); };
  } else if (!g.stop_strings.empty()) {
    ++metrics.requests_client_error;
    return send_error(res, 400, "invalid_request_error", "'stop' needs a tokenizer");
  }
  Result<EngineWorker::Submitted> sub = worker.submit(std::move(g));
  if (!sub.ok()) {
    const bool client = sub.status().code() == StatusCode::kInvalidArgument ||
                        sub.status().code() == StatusCode::kOutOfRange ||
                        sub.status().code() == StatusCode::kResourceExhausted;
    ++(client ? metrics.requests_client_error : metrics.requests_server_error);
    return send_status(res, sub.status());
  }
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(sub->id);
  const std::int64_t created = unix_now();
  // One choice object: the whole text, or one streamed delta.
  auto choice = [chat](const std::string& text, const Json& finish, bool stream, bool role,
                       const Json& logprobs) {
    Json c = {{"index", 0}, {"finish_reason", finish}, {"logprobs", logprobs}};
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
  };

  if (!p.stream) {
    // A client that goes away while its answer is computed has the request cancelled (the
    // streamed path notices at its next write; this one polls the connection).
    const ConnectionProbe probe =
        ConnectionProbe::find(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
    bool client_gone = false;
    RequestChannel::Snapshot snap;
    do {
      snap = sub->channel->wait(snap.tokens.size(), std::chrono::milliseconds(cfg.poll_ms));
      if (!snap.output && !client_gone && probe.peer_gone()) {
        client_gone = true;
        worker.cancel(sub->id);
      }
    } while (!snap.output);
    if (client_gone) {  // nobody reads the answer
      ++metrics.requests_cancelled;
      res.status = 499;  // nginx's "client closed request"; never seen by the client
      return;
    }
    if (!snap.output->ok()) {
      ++metrics.requests_server_error;
      return send_status(res, snap.output->status());
    }
    const RequestOutput& out = **snap.output;
    std::string text;
    append_utf8_sanitized(echo_text + out.text, 0, /*final=*/true, text);
    Json logprobs = nullptr;
    if (p.logprobs >= 0) {
      LogprobsJson lj(tokenizer, chat);
      for (std::size_t i = 0; i < echo_ids.size(); ++i) {
        const bool have = i > 0 && i - 1 < out.prompt_logprobs.size();
        lj.add(echo_ids[i], have ? &out.prompt_logprobs[i - 1] : nullptr);
      }
      for (std::size_t i = 0; i < out.tokens.size(); ++i) {
        lj.add(out.tokens[i], i < out.logprobs.size() ? &out.logprobs[i] : nullptr);
      }
      logprobs = lj.take();
    }
    ++(out.finish == FinishReason::kCancelled ? metrics.requests_cancelled : metrics.requests_ok);
    const Json body = {
        {"id", id},
        {"object", chat ? "chat.completion" : "text_completion"},
        {"created", created},
        {"model", cfg.model_name},
        {"choices", Json::array({choice(text, finish_reason(out.finish), false, false, logprobs)})},
        {"usage", usage_json(prompt_tokens, out.tokens.size())}};
    res.set_content(dump(body), "application/json");
    return;
  }

  auto st = std::make_shared<StreamState>();
  st->sub = std::move(*sub);
  for (const std::string& s : p.stop) st->hold_back = std::max(st->hold_back, s.size() - 1);
  if (p.logprobs >= 0) st->logprobs.emplace(tokenizer, chat);
  st->prompt_tokens = prompt_tokens;
  st->include_usage = p.include_usage;
  const std::string object = chat ? "chat.completion.chunk" : "text_completion";
  // A chunk: one choice with this text delta and the logprobs of the tokens not yet sent.
  auto event = [=, this](const std::string& text, const Json& finish, bool role) {
    const Json lp = st->logprobs && !st->logprobs->empty() ? st->logprobs->take() : Json(nullptr);
    const Json j = {{"id", id},
                    {"object", object},
                    {"created", created},
                    {"model", cfg.model_name},
                    {"choices", Json::array({choice(text, finish, true, role, lp)})}};
    return "data: " + dump(j) + "\n\n";
  };
  // stream_options.include_usage: the last chunk before [DONE], no choices.
  auto usage_event = [=, this](std::size_t completion_tokens) {
    const Json j = {{"id", id},
                    {"object", object},
                    {"created", created},
                    {"model", cfg.model_name},
                    {"choices", Json::array()},
                    {"usage", usage_json(st->prompt_tokens, completion_tokens)}};
    return "data: " + dump(j) + "\n\n";
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, event, usage_event, chat](std::size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        auto gone = [&] {  // the client went away: cancel in the engine, end this response
          worker.cancel(st->sub.id);
          return false;
        };
        if (chat && !st->role_sent) {
          st->role_sent = true;
          if (!write(event("", nullptr, true))) return gone();
        }
        RequestChannel::Snapshot snap =
            st->sub.channel->wait(st->seen, std::chrono::milliseconds(cfg.poll_ms));
        std::string delta;
        if (snap.output && !snap.output->ok()) {
          ++metrics.requests_server_error;
          st->finished = true;
          const Json err = {
              {"error", {{"message", snap.output->status().message()}, {"type", "server_error"}}}};
          write("data: " + dump(err) + "\n\n");
          write("data: [DONE]\n\n");
          sink.done();
          return true;
        }
        if (snap.output) {
          const std::string& final_text = (*snap.output)->text;
          if (final_text.size() >= st->sent_bytes) {
            st->sent_bytes = append_utf8_sanitized(final_text, st->sent_bytes, true, delta);
          }
        } else if (snap.tokens.size() > st->seen && tokenizer) {
          Result<std::string> bytes = detokenize(snap.tokens);
          if (bytes.ok() && bytes->size() > st->hold_back + st->sent_bytes) {
            const std::string_view safe(bytes->data(), bytes->size() - st->hold_back);
            st->sent_bytes = append_utf8_sanitized(safe, st->sent_bytes, false, delta);
          }
        }
        st->seen = snap.tokens.size();
        if (st->logprobs) {
          for (; st->logprobs_seen < snap.logprobs.size(); ++st->logprobs_seen) {
            st->logprobs->add(snap.tokens[st->logprobs_seen], &snap.logprobs[st->logprobs_seen]);
          }
        }
        const bool new_logprobs = st->logprobs && !st->logprobs->empty();
        if ((!delta.empty() || (new_logprobs && !snap.output)) &&
            !write(event(delta, nullptr, false))) {
          return gone();
        }
        if (snap.output) {
          const RequestOutput& out = **snap.output;
          st->finished = true;
          if (out.finish == FinishReason::kCancelled) {
            ++metrics.requests_cancelled;
          } else {
            ++metrics.requests_ok;
          }
          if (!write(event("", finish_reason(out.finish), false)) ||
              (st->include_usage && !write(usage_event(out.tokens.size()))) ||
              !write("data: [DONE]\n\n")) {
            return false;
          }
          sink.done();
        }
        return true;
      },
      [this, st](bool /*success*/) {
        if (!st->finished) {  // ended before the engine finished it: the client went away
          worker.cancel(st->sub.id);
          ++metrics.requests_cancelled;
          st->finished = true;
        }
      });
}

// {"prompt": "text"} or {"messages": [...]} (rendered as a chat completion would be) ->
// {"tokens": [ids], "count": n, "max_model_len": positions}.
void HttpServer::Impl::tokenize(const httplib::Request& req, httplib::Response& res) {
  if (!tokenizer) return client_error(res, "this model has no tokenizer");
  const Json j = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return client_error(res, "the request body must be a JSON object");
  }
  std::string text;
  if (j.contains("prompt") && j["prompt"].is_string()) {
    text = j["prompt"].get<std::string>();
  } else if (j.contains("messages")) {
    Result<CompletionParams> p = parse_completion_request(req.body, true, 1);
    if (!p.ok()) return client_error(res, p.status().message());
    text = model::render_chatml(p->messages, true);
  } else {
    return client_error(res, "'prompt' (a string) or 'messages' is required");
  }
  Result<std::vector<model::TokenId>> ids = tokenizer->encode(text);
  if (!ids.ok()) return client_error(res, ids.status().message());
  const Json body = {
      {"tokens", *ids}, {"count", ids->size()}, {"max_model_len", engine.config().max_seq_len}};
  res.set_content(dump(body), "application/json");
}

// {"tokens": [ids]} -> {"prompt": "text"} (special tokens kept, invalid UTF-8 as U+FFFD).
void HttpServer::Impl::detokenize_route(const httplib::Request& req, httplib::Response& res) {
  if (!tokenizer) return client_error(res, "this model has no tokenizer");
  const Json j = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("tokens") || !j["tokens"].is_array()) {
    return client_error(res, "'tokens' (a list of token ids) is required");
  }
  std::vector<model::TokenId> ids;
  for (const Json& t : j["tokens"]) {
    if (!t.is_number_integer() || t.get<std::int64_t>() < 0 ||
        t.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max()) {
      return client_error(res, "'tokens' must hold non-negative token ids");
    }
    ids.push_back(static_cast<model::TokenId>(t.get<std::int64_t>()));
  }
  Result<std::string> text = tokenizer->decode(ids);
  if (!text.ok()) return client_error(res, text.status().message());
  res.set_content(dump({{"prompt", *text}}), "application/json");
}

void HttpServer::Impl::routes() {
  http.set_tcp_nodelay(true);
  if (cfg.http_threads > 0) {
    http.new_task_queue = [n = std::size_t(cfg.http_threads)] {
      return new httplib::ThreadPool(n);
    };
  }
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const Json body = {{"object", "list"},
                       {"data", Json::array({{{"id", cfg.model_name},
                                              {"object", "model"},
                                              {"created", 0},
                                              {"owned_by", "ferry"}}})}};
    res.set_content(dump(body), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  // vLLM's /tokenize and /detokenize (the model's tokenizer, no engine involved).
  http.Post("/tokenize",
            [this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    detokenize_route(req, res);
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, false);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    completion(req, res, true);
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, 500, "server_error", what);
      });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) send_error(res, 404, "invalid_request_error", "no route " + req.path);
  });
}

HttpServer::HttpServer(Engine& engine, const model::Tokenizer* tokenizer, HttpServerConfig cfg)
    : impl_(std::make_unique<Impl>(engine, tokenizer, std::move(cfg))) {
  impl_->routes();
}

HttpServer::~HttpServer() { stop(); }

const ServerMetrics& HttpServer::metrics() const { return impl_->metrics; }

Result<int> HttpServer::start(const std::string& host, int port) {
  Impl& m = *impl_;
  if (m.listener.joinable() || m.stopped) return invalid_argument("serve http: already started");
  std::signal(SIGPIPE, SIG_IGN);
  const int bound =
      port == 0 ? m.http.bind_to_any_port(host) : (m.http.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) return unavailable("serve http: cannot bind {}:{}", host, port);
  m.listener = std::thread([&m, exited = m.exited] {
    try {
      m.http.listen_after_bind();
    } catch (const std::exception& e) {
      log::get("serve")->error("serve http: listener stopped: {}", e.what());
    }
    exited->store(true);
  });
  // httplib's stop() is lost if it comes before the listener runs (it would then block in
  // accept() forever), so start returns only once the listener runs or has exited.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!m.http.is_running() && !m.exited->load()) {
    if (std::chrono::steady_clock::now() > deadline) {
      m.listener.detach();
      return unavailable("serve http: listener on {}:{} did not start within 10 s", host, bound);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (m.exited->load()) {
    m.listener.join();
    return unavailable("serve http: listener on {}:{} exited at once", host, bound);
  }
  return bound;
}

void HttpServer::stop() {
  Impl& m = *impl_;
  if (m.stopped) return;
  m.stopped = true;
  // The worker first: it cancels what runs and wakes every handler waiting on a channel, so
  // httplib's stop can join its pool.
  m.worker.stop();
  if (m.listener.joinable()) {
    m.http.stop();  // once only: a second stop on a closed socket asserts in httplib
    m.listener.join();
  }
}

}  // namespace ferry::serve::http
