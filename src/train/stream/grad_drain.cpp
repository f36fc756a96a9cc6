// SPDX-License-Identifier: Apache-2.0
#include "train/stream/grad_drain.h"

#include "core/check.h"
#include "core/timer.h"

namespace ferry::train::stream {

GradDrain::GradDrain(std::vector<float*> slots, mem::TransferEngine& engine, mem::Stream& d2h)
    : slots_(std::move(slots)), engine_(engine), d2h_(d2h), jobs_(slots_.size()) {
  FERRY_CHECK(!slots_.empty(), "train: gradient drain without slots");
  thread_ = std::thread([this] { run(); });
}

GradDrain::~GradDrain() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int GradDrain::acquire(double* waited_s) {
  Timer t;
  std::unique_lock lk(mu_);
  FERRY_CHECK(acquired_ == submitted_, "train: gradient slot acquired twice without a submit");
  // Job n reuses the slot of job n - slots: wait for that drain.
  const std::uint64_t n = submitted_;
  cv_.wait(lk, [&] { return done_ + slots_.size() > n; });
  ++acquired_;
  *waited_s += t.elapsed_s();
  return static_cast<int>(n % slots_.size());
}

void GradDrain::submit(float* host_dst, std::size_t bytes) {
  {
    std::lock_guard lk(mu_);
    FERRY_CHECK(acquired_ == submitted_ + 1, "train: gradient drain submitted without acquire");
    jobs_[submitted_ % slots_.size()] = {host_dst, bytes};
    ++submitted_;
  }
  cv_.notify_all();
}

Status GradDrain::flush(double* waited_s) {
  Timer t;
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return done_ == submitted_; });
  *waited_s += t.elapsed_s();
  return error_;
}

std::uint64_t GradDrain::bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

void GradDrain::run() {
  for (;;) {
    Job job;
    std::uint64_t n = 0;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || submitted_ > done_; });
      if (stop_) return;
      n = done_;
      job = jobs_[n % slots_.size()];
    }
    Status st = engine_.d2h(job.dst, slots_[n % slots_.size()], job.bytes, d2h_);
    if (st.ok()) st = d2h_.synchronize();
    {
      std::lock_guard lk(mu_);
      if (!st.ok() && error_.ok()) error_ = st;
      if (st.ok()) bytes_ += job.bytes;
      ++done_;
    }
    cv_.notify_all();
  }
}

}  // namespace ferry::train::stream
