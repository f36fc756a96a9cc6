// SPDX-License-Identifier: Apache-2.0
#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace ferry {

ThreadPool::ThreadPool(std::size_t num_threads) {
  for (std::size_t i = 0; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (stop_ && tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

std::future<void> ThreadPool::submit(std::function<void()> task) {
  std::packaged_task<void()> pt(std::move(task));
  auto fut = pt.get_future();
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(pt));
  }
  cv_.notify_one();
  return fut;
}

void ThreadPool::parallel_for(std::size_t n,
                              const std::function<void(std::size_t, std::size_t)>& fn,
                              std::size_t min_chunk) {
  if (n == 0) return;
  const std::size_t max_parts = workers_.size() + 1;
  const std::size_t parts =
      std::max<std::size_t>(1, std::min(max_parts, n / std::max<std::size_t>(1, min_chunk)));
  if (parts == 1) {
    fn(0, n);
    return;
  }
  const std::size_t chunk = (n + parts - 1) / parts;
  std::vector<std::future<void>> futs;
  futs.reserve(parts - 1);
  for (std::size_t p = 1; p < parts; ++p) {
    const std::size_t b = p * chunk;
    const std::size_t e = std::min(n, b + chunk);
    if (b >= e) break;
    futs.push_back(submit([&fn, b, e] { fn(b, e); }));
  }
  fn(0, std::min(n, chunk));
  for (auto& f : futs) f.get();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("FERRY_NUM_THREADS")) {
      const long v = std::strtol(env, nullptr, 10);
      if (v >= 1) return static_cast<std::size_t>(v - 1);
    }
    const unsigned hc = std::thread::hardware_concurrency();
    return static_cast<std::size_t>(hc > 1 ? hc - 1 : 0);
  }());
  return pool;
}

}  // namespace ferry
