// SPDX-License-Identifier: Apache-2.0
#include "train/stream/nvme_read_ahead.h"

#include <utility>

#include "core/check.h"
#include "core/timer.h"

namespace ferry::train::stream {

NvmeReadAhead::NvmeReadAhead(mem::NvmeStore& store, std::vector<std::byte*> staging,
                             std::vector<const mem::Event*> staging_free)
    : store_(store), staging_(std::move(staging)), staging_free_(std::move(staging_free)) {
  FERRY_CHECK(!staging_.empty() && staging_.size() == staging_free_.size(),
              "NvmeReadAhead: {} buffers, {} events", staging_.size(), staging_free_.size());
  thread_ = std::thread([this] { run(); });
}

NvmeReadAhead::~NvmeReadAhead() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void NvmeReadAhead::drain_locked(std::unique_lock<std::mutex>& lock) {
  records_.clear();  // no further read starts
  cv_.wait(lock, [&] { return !reading_; });
  status_.clear();
  disk_s_.clear();
  landed_ = released_ = taken_ = 0;
}

void NvmeReadAhead::begin(std::vector<mem::RecordId> records) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    drain_locked(lock);
    status_.assign(records.size(), Status{});
    disk_s_.assign(records.size(), 0.0);
    records_ = std::move(records);
  }
  cv_.notify_all();
}

Result<NvmeReadAhead::Landed> NvmeReadAhead::take(int m) {
  std::unique_lock<std::mutex> lock(mu_);
  FERRY_CHECK(m == taken_ && m < static_cast<int>(records_.size()),
              "NvmeReadAhead: take({}) with {} taken of {}", m, taken_, records_.size());
  cv_.wait(lock, [&] { return landed_ > m; });
  ++taken_;
  const auto i = static_cast<std::size_t>(m);
  if (!status_[i].ok()) return status_[i];
  return Landed{.data = staging_[i % staging_.size()], .disk_s = disk_s_[i]};
}

void NvmeReadAhead::release(int m) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    FERRY_CHECK(m == released_ && m < taken_, "NvmeReadAhead: release({}) with {} released", m,
                released_);
    released_ = m + 1;
  }
  cv_.notify_all();
}

void NvmeReadAhead::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Read m needs its buffer: read m - k's copy out of it enqueued (released) ...
    const int k = static_cast<int>(staging_.size());
    cv_.wait(lock, [&] {
      return stop_ || (landed_ < static_cast<int>(records_.size()) && landed_ < released_ + k);
    });
    if (stop_) return;
    const int m = landed_;
    const auto i = static_cast<std::size_t>(m);
    const mem::RecordId record = records_[i];
    std::byte* dst = staging_[i % staging_.size()];
    const mem::Event* free = m >= k ? staging_free_[i % staging_.size()] : nullptr;
    reading_ = true;
    lock.unlock();
    // ... and completed on its stream.
    Status st = free != nullptr ? free->synchronize() : Status{};
    const Timer disk;
    if (st.ok()) st = store_.read(record, dst);
    const double s = disk.elapsed_s();
    lock.lock();
    reading_ = false;
    if (i < status_.size()) {  // else begin() dropped the sequence meanwhile
      status_[i] = std::move(st);
      disk_s_[i] = s;
      ++landed_;
    }
    cv_.notify_all();
  }
}

}  // namespace ferry::train::stream
