// SPDX-License-Identifier: Apache-2.0
// Batch thread, admission and the emulated strong detector's service time (see server_batcher.h).
#include "route/server_batcher.h"

#include <algorithm>
#include <cmath>

namespace ferry::route {

double service_fps(const BatcherOptions& o) {
  const double ms = o.batch_base_ms + o.per_frame_ms * o.max_batch;
  return ms <= 0 ? 1e6 : 1000.0 * o.max_batch / ms;
}

Batcher::Batcher(BatcherOptions opts, DetectFn detect, BatchHook on_batch)
    : opts_(opts),
      detect_(std::move(detect)),
      on_batch_(std::move(on_batch)),
      tokens_(std::max(1, opts.max_batch)),
      last_refill_(Clock::now()) {
  thread_ = std::thread([this] { loop(); });
}

Batcher::~Batcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& it : waiting_) it->done.set_value(cancelled("route server: shutting down"));
}

int Batcher::depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return depth_;
}

std::int64_t Batcher::rejected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rejected_;
}

bool Batcher::admit(double* retry_after_s) {
  if (depth_ >= opts_.max_queue) {
    const double drain_s = depth_ / std::max(1.0, service_fps(opts_));
    *retry_after_s = std::max(1.0, std::ceil(drain_s));
    return false;
  }
  if (opts_.capacity_fps > 0) {
    const auto now = Clock::now();
    const double dt = std::chrono::duration<double>(now - last_refill_).count();
    last_refill_ = now;
    tokens_ = std::min<double>(std::max(1, opts_.max_batch), tokens_ + dt * opts_.capacity_fps);
    if (tokens_ < 1) {
      *retry_after_s = std::max(1.0, std::ceil((1 - tokens_) / opts_.capacity_fps));
      return false;
    }
    tokens_ -= 1;
  }
  return true;
}

Result<BatchReply> Batcher::run(int frame, double* retry_after_s) {
  auto item = std::make_shared<Item>(Item{frame, Clock::now(), {}});
  auto fut = item->done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return cancelled("route server: shutting down");
    if (!admit(retry_after_s)) {
      ++rejected_;
      return resource_exhausted("route server: over capacity (depth {}, limit {}, {:.1f} fps)",
                                depth_, opts_.max_queue, opts_.capacity_fps);
    }
    ++depth_;
    waiting_.push_back(item);
  }
  cv_.notify_all();
  Result<BatchReply> r = fut.get();
  std::lock_guard<std::mutex> lock(mu_);
  --depth_;
  return r;
}

void Batcher::loop() {
  const auto timeout = std::chrono::duration<double, std::milli>(opts_.batch_timeout_ms);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !waiting_.empty(); });
    if (stop_) return;
    const auto deadline =
        waiting_.front()->admitted + std::chrono::duration_cast<Clock::duration>(timeout);
    cv_.wait_until(lock, deadline,
                   [&] { return stop_ || static_cast<int>(waiting_.size()) >= opts_.max_batch; });
    if (stop_) return;
    const std::size_t n = std::min<std::size_t>(waiting_.size(), opts_.max_batch);
    std::vector<std::shared_ptr<Item>> batch(waiting_.begin(),
                                             waiting_.begin() + static_cast<std::ptrdiff_t>(n));
    waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(n));
    lock.unlock();
    const auto start = Clock::now();
    const double service_ms = opts_.batch_base_ms + opts_.per_frame_ms * static_cast<double>(n);
    if (service_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(service_ms));
    std::vector<Result<std::vector<Detection>>> dets;
    dets.reserve(n);
    for (auto& it : batch) dets.push_back(detect_(it->frame));
    // The batch's metrics before its replies: a client that has its answer sees the batch in
    // /metrics (a test read the histogram sum one batch short under load otherwise).
    if (on_batch_) {
      on_batch_(static_cast<int>(n),
                std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
    for (std::size_t i = 0; i < n; ++i) {
      auto& it = batch[i];
      if (!dets[i].ok()) {
        it->done.set_value(dets[i].status());
        continue;
      }
      BatchReply rep;
      rep.dets = std::move(*dets[i]);
      rep.batch_size = static_cast<int>(n);
      rep.queue_ms = std::chrono::duration<double, std::milli>(start - it->admitted).count();
      it->done.set_value(std::move(rep));
    }
    lock.lock();
  }
}

}  // namespace ferry::route
