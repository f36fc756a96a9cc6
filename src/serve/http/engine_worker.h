// SPDX-License-Identifier: Apache-2.0
// EngineWorker: the one thread that owns an Engine and steps it while requests exist.
//   HTTP handler threads                      engine thread
//   submit(req) ──command queue──▶  Engine::submit ──▶ id (or the error) back to the caller
//   channel->wait(...)  ◀──per-request channel──  step(): token ids, then the RequestOutput
//   cancel(id)   ──command queue──▶  Engine::cancel (client disconnect)
// The Engine is touched only by the engine thread (it is not thread-safe); handlers see a
// request only through its RequestChannel. stop() cancels what is still in flight and wakes every
// waiter (their output then has FinishReason::kCancelled).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/result.h"
#include "serve/engine.h"
#include "serve/http/metrics.h"

namespace ferry::serve::http {

// What the engine thread has produced for one request so far.
class RequestChannel {
 public:
  // Engine thread. `logprob`: the token's, when the request asked for logprobs.
  void push_token(std::int32_t token, const std::optional<TokenLogprob>& logprob = std::nullopt);
  void finish(Result<RequestOutput> out);

  // Handler threads: waits until there are more than `seen` tokens or the request finished, or
  // the timeout passes. Returns a snapshot.
  struct Snapshot {
    std::vector<std::int32_t> tokens;
    // The logprobs of tokens[seen..] (those the caller has not seen; when the request asked for
    // them): copied per wait, so a stream does not copy its whole history every poll.
    std::vector<TokenLogprob> logprobs;
    std::optional<Result<RequestOutput>> output;  // set once finished
  };
  Snapshot wait(std::size_t seen, std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::int32_t> tokens_;
  std::vector<TokenLogprob> logprobs_;
  std::optional<Result<RequestOutput>> output_;
};

class EngineWorker {
 public:
  // The engine must outlive the worker; metrics may be null.
  EngineWorker(Engine& engine, ServerMetrics* metrics);
  ~EngineWorker();
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  struct Submitted {
    RequestId id;
    std::shared_ptr<RequestChannel> channel;
  };
  // Blocks until the engine thread has taken the request (at most one step); the engine's
  // validation errors (invalid_argument: prompt too long, bad ids, ...) come back here.
  Result<Submitted> submit(GenerationRequest request);
  // Asks the engine to cancel; a request already finished is left alone.
  void cancel(RequestId id);
  void stop();

 private:
  struct Command {
    enum class Kind : std::uint8_t { kSubmit, kCancel } kind;
    GenerationRequest request;
    RequestId id = 0;
    std::shared_ptr<std::promise<Result<Submitted>>> reply;
  };
  struct Live {
    std::shared_ptr<RequestChannel> channel;
    std::chrono::steady_clock::time_point last;  // submit, then the latest token
    bool got_token = false;
  };
  void loop();
  void step_once();
  void publish_gauges();

  Engine& engine_;
  ServerMetrics* metrics_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> commands_;
  bool stopping_ = false;
  std::map<RequestId, Live> live_;  // engine thread only
  std::thread thread_;
};

}  // namespace ferry::serve::http
