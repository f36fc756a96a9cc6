// SPDX-License-Identifier: Apache-2.0
// Dynamic batching and admission control for the route cloud server (server.h).
// Request threads call run(frame): admission first (queue bound: admitted-but-unfinished requests
// ≤ max_queue; rate: a wall-clock token bucket of capacity_fps with burst max_batch), then the
// request waits in a FIFO. One batch thread takes up to max_batch requests as soon as max_batch
// are waiting or the oldest has waited batch_timeout_ms, runs the strong detector on the whole
// batch (emulated service time batch_base_ms + per_frame_ms·n, then `detect` per frame) and
// wakes the waiters. A rejected request is answered at once (the server sends 503 + Retry-After).
// Thread-safety: run() from any number of threads; the destructor fails waiting requests with
// kCancelled and joins the batch thread. Covered by tests/unit/route/server_test.cpp.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/result.h"
#include "route/detection.h"

namespace ferry::route {

struct BatcherOptions {
  int max_batch = 8;
  double batch_timeout_ms = 2;
  int max_queue = 64;       // admitted, unfinished requests
  double capacity_fps = 0;  // admission rate limit; 0 = none (queue bound only)
  double batch_base_ms = 2, per_frame_ms = 0.5;  // emulated strong-detector service time
};

// The frames per second the emulated detector can serve with full batches.
double service_fps(const BatcherOptions& o);

struct BatchReply {
  std::vector<Detection> dets;
  int batch_size = 0;
  double queue_ms = 0;  // admission to batch start
};

class Batcher {
 public:
  using DetectFn = std::function<Result<std::vector<Detection>>(int frame)>;
  using BatchHook = std::function<void(int batch_size, double service_ms)>;
  Batcher(BatcherOptions opts, DetectFn detect, BatchHook on_batch);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Blocks until the frame's batch ran. kResourceExhausted = not admitted (*retry_after_s set).
  Result<BatchReply> run(int frame, double* retry_after_s);
  int depth() const;  // admitted, unfinished
  std::int64_t rejected() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Item {
    int frame;
    Clock::time_point admitted;
    std::promise<Result<BatchReply>> done;
  };
  bool admit(double* retry_after_s);  // under mu_
  void loop();

  const BatcherOptions opts_;
  DetectFn detect_;
  BatchHook on_batch_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Item>> waiting_;  // shared: the waiter may leave first
  int depth_ = 0;
  std::int64_t rejected_ = 0;
  double tokens_;
  Clock::time_point last_refill_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ferry::route
