// SPDX-License-Identifier: Apache-2.0
#include "train/stream/weight_streamer.h"

#include "core/check.h"

namespace ferry::train::stream {

Result<std::unique_ptr<WeightStreamer>> WeightStreamer::create(
    const HostArena& arena, LayerOptimizer& opt, std::vector<float*> slots,
    std::vector<int> schedule, mem::TransferEngine& engine, mem::Stream& h2d, mem::Stream& compute,
    const Bf16Landing* landing, const Bf16ViewLanding* views, std::vector<std::uint16_t*> twins) {
  if (arena.bf16_weights() && landing == nullptr && views == nullptr) {
    return invalid_argument("train: bf16 streaming weights need a landing (bf16_widen.h)");
  }
  if (views != nullptr && (!arena.bf16_weights() || twins.size() != slots.size())) {
    return invalid_argument("train: bf16 weight views need bf16 weights and a twin per slot");
  }
  std::vector<mem::Event> free;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(mem::Event e,
                           mem::Event::create(compute.device(), compute.device_index()));
    free.push_back(std::move(e));
  }
  return std::unique_ptr<WeightStreamer>(
      new WeightStreamer(arena, opt, std::move(slots), std::move(schedule), engine, h2d, compute,
                         landing, views, std::move(twins), std::move(free)));
}

WeightStreamer::WeightStreamer(const HostArena& arena, LayerOptimizer& opt,
                               std::vector<float*> slots, std::vector<int> schedule,
                               mem::TransferEngine& engine, mem::Stream& h2d, mem::Stream& compute,
                               const Bf16Landing* landing, const Bf16ViewLanding* views,
                               std::vector<std::uint16_t*> twins, std::vector<mem::Event> free)
    : arena_(arena),
      opt_(opt),
      slots_(std::move(slots)),
      schedule_(std::move(schedule)),
      engine_(engine),
      h2d_(h2d),
      compute_(compute),
      landing_(landing),
      views_(views),
      twins_(std::move(twins)),
      free_(std::move(free)) {
  FERRY_CHECK(slots_.size() >= 2, "train: weight streamer needs >= 2 slots, got {}", slots_.size());
  thread_ = std::thread([this] { run(); });
}

WeightStreamer::~WeightStreamer() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void WeightStreamer::start_micro_batch() {
  {
    std::lock_guard lk(mu_);
    FERRY_CHECK(produced_ == static_cast<int>(schedule_.size()) || epoch_ == 0,
                "train: micro-batch started before the previous one was streamed");
    ++epoch_;
    produced_ = 0;
    released_ = 0;
  }
  cv_.notify_all();
}

Result<int> WeightStreamer::acquire(int j) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return produced_ > j || !error_.ok(); });
  FERRY_TRY(error_);
  return j % static_cast<int>(slots_.size());
}

void WeightStreamer::release(int j) {
  // The slot is free once the kernels enqueued so far on compute have run (a bug if this fails:
  // recording an event on a live stream of its own device cannot fail otherwise).
  const Status st = free_[static_cast<std::size_t>(j) % free_.size()].record(compute_);
  FERRY_CHECK(st.ok(), "train: recording a weight slot's free event: {}", st.to_string());
  {
    std::lock_guard lk(mu_);
    FERRY_CHECK(j == released_, "train: slot items released out of order ({} after {})", j,
                released_);
    released_ = j + 1;
  }
  cv_.notify_all();
}

Status WeightStreamer::finish() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return produced_ == static_cast<int>(schedule_.size()) || !error_.ok(); });
  return error_;
}

std::uint64_t WeightStreamer::h2d_bytes() const {
  std::lock_guard lk(mu_);
  return bytes_;
}

void WeightStreamer::run() {
  std::uint64_t seen = 0;
  const int n = static_cast<int>(schedule_.size());
  const int depth = static_cast<int>(slots_.size());
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || epoch_ > seen; });
      if (stop_) return;
      seen = epoch_;
    }
    for (int j = 0; j < n; ++j) {
      {
        // The slot of item j held item j - depth: free once that item was released.
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || released_ > j - depth; });
        if (stop_) return;
      }
      const int layer = schedule_[static_cast<std::size_t>(j)];
      opt_.wait_ready(layer);
      const std::size_t bytes = arena_.unit_weight_bytes(layer);
      float* slot = slots_[static_cast<std::size_t>(j % depth)];
      const std::int64_t elems = arena_.unit_elements(layer);
      // The kernels that read the slot's previous item must have run (device-side wait).
      Status st = h2d_.wait(free_[static_cast<std::size_t>(j % depth)]);
      if (st.ok()) {
        if (views_ != nullptr) {
          st = views_->land(slot, twins_[static_cast<std::size_t>(j % depth)], layer,
                            arena_.w16(layer), elems, engine_, h2d_);
        } else if (arena_.bf16_weights()) {
          st = landing_->land(slot, arena_.w16(layer), elems, engine_, h2d_);
        } else {
          st = engine_.h2d(slot, arena_.weights(layer), bytes, h2d_);
        }
      }
      if (st.ok()) st = h2d_.synchronize();
      {
        std::lock_guard lk(mu_);
        if (!st.ok()) {
          error_ = st;
          produced_ = n;
        } else {
          bytes_ += bytes;
          produced_ = j + 1;
        }
      }
      cv_.notify_all();
      if (!st.ok()) break;
    }
  }
}

}  // namespace ferry::train::stream
