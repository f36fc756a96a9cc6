// SPDX-License-Identifier: Apache-2.0
// HttpServer: OpenAI-style HTTP over one Engine (cpp-httplib; docs/serve.md "HTTP server").
//   GET  /health               {"status": "ok"}
//   GET  /v1/models            the one model this server runs
//   POST /v1/completions       prompt text or token ids -> text (openai_api.h for the fields)
//   POST /v1/chat/completions  messages -> ChatML prompt -> assistant text
//   GET  /metrics              Prometheus text (metrics.h)
//   POST /tokenize             {"prompt"} or {"messages"} -> {"tokens", "count", "max_model_len"}
//   POST /detokenize           {"tokens"} -> {"prompt"} (vLLM's two tokenizer endpoints)
// "stream": true answers with server-sent events (`data: {...}\n\n` ..., `data: [DONE]\n\n`);
// a client that goes away mid-stream has its request cancelled in the engine. Errors are
// {"error": {"message", "type"}} with a 4xx status (400 bad body/values/too long a prompt, 404
// unknown model or path, 401 without the API key) or 5xx; no exception leaves a handler and the
// server keeps serving. With an API key every route but /health and /metrics needs
// `Authorization: Bearer <key>` (as vLLM's and llama.cpp's --api-key).
// Threads: httplib's pool runs handlers; an EngineWorker thread owns the engine.
// Generation stops at the tokenizer's <|im_end|> and <|endoftext|> (when it has them; see
// default_stop_ids) and the response text leaves special tokens out.
//   HttpServer srv(engine, &tokenizer, {.model_name = "m"});
//   FERRY_ASSIGN_OR_RETURN(int port, srv.start("127.0.0.1", 0));  ... srv.stop();
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "model/tokenizer/chat_renderer.h"
#include "model/tokenizer/tokenizer.h"
#include "serve/engine.h"
#include "serve/http/metrics.h"

namespace ferry::serve::http {

struct HttpServerConfig {
  std::string model_name = "ferry";
  int default_max_tokens = 16;  // when a request gives no max_tokens (OpenAI's default)
  int poll_ms = 50;             // how often a waiting stream checks its connection
  // Connection handler threads (httplib's pool; each open stream or waiting request holds one,
  // more connections queue at the socket, /health and /metrics among them). 0: httplib's own
  // default (max(8, cores - 1)) raised to 2 x the engine's max_running + 8 (every running
  // request, as many waiting to be admitted, and 8 for /health, /metrics and short requests).
  // httplib's default alone kept a small host from reaching a larger max_running (2 cores, 8
  // threads: 4 of 12 streams reached the engine).
  int http_threads = 0;
  // How /v1/chat/completions (and /tokenize with messages) render messages: the model's chat
  // template (model/tokenizer/chat_renderer.h); null: plain ChatML (the built-in model's).
  std::shared_ptr<const model::ChatRenderer> chat;
  // Non-empty: those endpoints answer 400 with this message instead (the model has no chat
  // template, or one ferry cannot render: a wrong prompt is never sent to the model).
  std::string chat_refusal;
  // Generation also stops at these ids (unless ignore_eos), besides default_stop_ids: the model's
  // own end tokens (generation_config.json eos_token_id, tokenizer_config.json eos_token), e.g.
  // Llama 3's <|eot_id|>.
  std::vector<std::int32_t> extra_stop_ids;
  // Non-empty: requests other than GET /health and GET /metrics must carry
  // `Authorization: Bearer <api_key>`, else 401 {"error": {...}} (compared in constant time).
  std::string api_key;
};

// Whether an Authorization header value carries `key` as its bearer token: "Bearer <key>", the
// scheme case-insensitive, spaces after it skipped; compared in time independent of where the
// first difference is.
bool bearer_matches(std::string_view authorization, std::string_view key);

// The ids generation stops at: <|im_end|> and <|endoftext|>, those the tokenizer has.
std::vector<std::int32_t> default_stop_ids(const model::Tokenizer& tokenizer);

class HttpServer {
 public:
  // engine and tokenizer must outlive the server; without a tokenizer only token-id prompts work.
  HttpServer(Engine& engine, const model::Tokenizer* tokenizer, HttpServerConfig cfg);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (0: any free port), starts listening, returns the bound port. Ignores SIGPIPE
  // for the process (a write to a closed connection must fail, not kill the server).
  Result<int> start(const std::string& host, int port);
  // Idempotent: stops listening, cancels what is in flight, joins the threads.
  void stop();
  const ServerMetrics& metrics() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::serve::http
