// SPDX-License-Identifier: Apache-2.0
#include "train/stream/grad_drain.h"

#include "core/check.h"

namespace ferry::train::stream {

Result<std::unique_ptr<GradDrain>> GradDrain::create(std::vector<void*> slots,
                                                     mem::TransferEngine& engine, mem::Stream& d2h,
                                                     mem::Stream& compute) {
  std::vector<mem::Event> ready;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(mem::Event e,
                           mem::Event::create(compute.device(), compute.device_index()));
    ready.push_back(std::move(e));
  }
  return std::unique_ptr<GradDrain>(
      new GradDrain(std::move(slots), engine, d2h, compute, std::move(ready)));
}

GradDrain::GradDrain(std::vector<void*> slots, mem::TransferEngine& engine, mem::Stream& d2h,
                     mem::Stream& compute, std::vector<mem::Event> ready)
    : slots_(std::move(slots)),
      engine_(engine),
      d2h_(d2h),
      compute_(compute),
      ready_(std::move(ready)),
      jobs_(slots_.size()) {
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

int GradDrain::acquire() {
  std::unique_lock lk(mu_);
  FERRY_CHECK(acquired_ == submitted_, "train: gradient slot acquired twice without a submit");
  // Job n reuses the slot of job n - slots: wait for that drain.
  const std::uint64_t n = submitted_;
  cv_.wait(lk, [&] { return done_ + slots_.size() > n; });
  ++acquired_;
  return static_cast<int>(n % slots_.size());
}

void GradDrain::submit(void* host_dst, std::size_t bytes) {
  {
    std::lock_guard lk(mu_);
    FERRY_CHECK(acquired_ == submitted_ + 1, "train: gradient drain submitted without acquire");
    // The slot holds the gradient once the kernels enqueued so far on compute have run.
    const Status st = ready_[submitted_ % slots_.size()].record(compute_);
    FERRY_CHECK(st.ok(), "train: recording a gradient slot's ready event: {}", st.to_string());
    jobs_[submitted_ % slots_.size()] = {host_dst, bytes};
    ++submitted_;
  }
  cv_.notify_all();
}

Status GradDrain::flush() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return done_ == submitted_; });
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
    Status st = d2h_.wait(ready_[n % slots_.size()]);
    if (st.ok()) st = engine_.d2h(job.dst, slots_[n % slots_.size()], job.bytes, d2h_);
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
