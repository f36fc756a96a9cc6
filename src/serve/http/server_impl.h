// SPDX-License-Identifier: Apache-2.0
// The HTTP server's insides shared by its files (not part of the public interface):
// HttpServer::Impl (routes and lifecycle in http_server.cpp, the completion handlers in
// completion_handler.cpp) and the JSON error helpers.
#pragma once

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/json.h"
#include "serve/http/engine_worker.h"
#include "serve/http/http_server.h"

namespace ferry::serve::http {

std::string dump(const Json& j);
// {"error": {"message", "type"}} with the status.
void send_error(httplib::Response& res, int status, const std::string& type,
                const std::string& message);
// An engine/worker Status as an HTTP error: the caller's fault is 400, the rest 5xx.
void send_status(httplib::Response& res, const Status& s);
std::string_view finish_reason(FinishReason r);
std::int64_t unix_now();

struct HttpServer::Impl {
  Impl(Engine& e, const model::Tokenizer* t, HttpServerConfig c)
      : engine(e), tokenizer(t), cfg(std::move(c)), worker(e, &metrics) {
    if (tokenizer) stop_ids = default_stop_ids(*tokenizer);
    for (const std::int32_t id : cfg.extra_stop_ids) {
      if (std::find(stop_ids.begin(), stop_ids.end(), id) == stop_ids.end()) stop_ids.push_back(id);
    }
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
  // The answer's text: special tokens left out.
  // The prompt text of chat messages (cfg.chat, or ChatML); the caller checked chat_refusal.
  Result<std::string> render_chat(std::span<const model::ChatMessage> messages) const {
    if (cfg.chat) return cfg.chat->render(messages, /*add_generation_prompt=*/true);
    return model::render_chatml(messages, true);
  }
  Result<std::string> detokenize(std::span<const std::int32_t> ids) const {
    return tokenizer->decode(ids, {.skip_special_tokens = true});
  }
};

}  // namespace ferry::serve::http
