// SPDX-License-Identifier: Apache-2.0
// See http_server.h. The routes, /tokenize and /detokenize, start and stop; the completion
// handlers are in completion_handler.cpp.
#include "serve/http/http_server.h"

#include "serve/http/server_impl.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <csignal>
#include <exception>
#include <limits>
#include <thread>

#include "core/json.h"
#include "core/log.h"
#include "serve/http/engine_worker.h"
#include "serve/http/openai_api.h"

namespace ferry::serve::http {

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

void send_error(httplib::Response& res, int status, const std::string& type,
                const std::string& message) {
  res.status = status;
  res.set_content(dump({{"error", {{"message", message}, {"type", type}}}}), "application/json");
}

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

std::vector<std::int32_t> default_stop_ids(const model::Tokenizer& tokenizer) {
  std::vector<std::int32_t> ids;
  for (const char* t : {"<|im_end|>", "<|endoftext|>"}) {
    const std::int32_t id = tokenizer.token_to_id(t);
    if (id >= 0) ids.push_back(id);
  }
  return ids;
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
    if (!cfg.chat_refusal.empty()) return client_error(res, cfg.chat_refusal);
    Result<CompletionParams> p = parse_completion_request(req.body, true, 1);
    if (!p.ok()) return client_error(res, p.status().message());
    Result<std::string> rendered = render_chat(p->messages);
    if (!rendered.ok()) return client_error(res, rendered.status().message());
    text = std::move(*rendered);
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

bool bearer_matches(std::string_view authorization, std::string_view key) {
  constexpr std::string_view kScheme = "bearer";
  if (authorization.size() < kScheme.size()) return false;
  for (std::size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return false;
  }
  std::string_view token = authorization.substr(kScheme.size());
  if (token.empty() || token.front() != ' ') return false;
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  // Every byte of the longer one is visited whatever the contents; only the lengths leak.
  unsigned diff = token.size() == key.size() ? 0u : 1u;
  const std::size_t n = std::max(token.size(), key.size());
  for (std::size_t i = 0; i < n; ++i) {
    const auto a = i < token.size() ? static_cast<unsigned char>(token[i]) : 0u;
    const auto b = i < key.size() ? static_cast<unsigned char>(key[i]) : 0u;
    diff |= a ^ b;
  }
  return diff == 0;
}

void HttpServer::Impl::routes() {
  http.set_tcp_nodelay(true);
  if (!cfg.api_key.empty()) {
    // Before routing, so an unknown path without the key is 401 too (no route probing).
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      const bool open = req.method == "GET" && (req.path == "/health" || req.path == "/metrics");
      if (open || bearer_matches(req.get_header_value("Authorization"), cfg.api_key)) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, 401, "authentication_error",
                 "missing or wrong API key: send 'Authorization: Bearer <key>'");
      return httplib::Server::HandlerResponse::Handled;
    });
  }
  // HttpServerConfig::http_threads says why the default is raised above httplib's.
  const int threads = cfg.http_threads > 0
                          ? cfg.http_threads
                          : std::max(static_cast<int>(CPPHTTPLIB_THREAD_POOL_COUNT),
                                     2 * std::max(engine.config().max_running, 1) + 8);
  http.new_task_queue = [n = std::size_t(threads)] { return new httplib::ThreadPool(n); };
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
