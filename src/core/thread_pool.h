// SPDX-License-Identifier: Apache-2.0
// A fixed-size thread pool for CPU kernels and background work.
// parallel_for splits [0, n) into contiguous chunks, one per worker, and blocks until all finish;
// it is safe to call from one thread at a time per pool (kernels use the global pool from the
// calling thread). submit() runs a task asynchronously and returns a future.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry {

class ThreadPool {
 public:
  explicit ThreadPool(std::size_t num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::size_t size() const { return workers_.size(); }

  // fn(begin, end) over contiguous chunks of [0, n); at least min_chunk items per chunk.
  // The calling thread runs one chunk itself.
  void parallel_for(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn,
                    std::size_t min_chunk = 1);

  std::future<void> submit(std::function<void()> task);

  // The process-wide pool, sized from FERRY_NUM_THREADS or hardware_concurrency().
  static ThreadPool& global();

 private:
  void worker_loop();
  std::vector<std::thread> workers_;
  std::deque<std::packaged_task<void()>> tasks_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

// fn(j) for j in [0, n), handed out one at a time to `threads` threads of its own (0: one per
// hardware thread; the caller is one of them), for long uneven items (multi-GB model fills) and
// for tests that vary the thread count, which the global pool fixes. Returns when all are done.
template <typename Fn>
void parallel_items(std::size_t n, int threads, const Fn& fn) {
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t j; (j = next.fetch_add(1)) < n;) fn(j);
  };
  const std::size_t want =
      threads > 0 ? std::size_t(threads) : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < std::min(want, std::max<std::size_t>(n, 1)); ++t) {
    pool.emplace_back(work);
  }
  work();
  for (std::thread& t : pool) t.join();
}

}  // namespace ferry
