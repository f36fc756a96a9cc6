// SPDX-License-Identifier: Apache-2.0
// GradDrain: layer gradients leave the device as they are produced, on a dedicated D2H thread,
// while compute goes on with the next layer. The executor fills gradient slot k = n % slots for
// its n-th layer backward, takes the sums of squares on the device copy, then submit()s the
// drain; acquire() hands out the next slot once its previous drain has completed.
// Copies go through mem::TransferEngine on the d2h stream and are counted here. GPU compute runs
// behind its host thread: submit() records the slot's ready event on the compute stream and the
// drain's copy waits for it on the d2h stream (host streams: always complete, no change).
// Threading: acquire / submit / flush from the compute thread only; no allocation after
// construction.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/result.h"
#include "mem/event.h"
#include "mem/transfer_engine.h"

namespace ferry::train::stream {

class GradDrain {
 public:
  // compute: the stream whose kernels write the slots.
  static Result<std::unique_ptr<GradDrain>> create(std::vector<void*> slots,
                                                   mem::TransferEngine& engine, mem::Stream& d2h,
                                                   mem::Stream& compute);
  ~GradDrain();
  GradDrain(const GradDrain&) = delete;
  GradDrain& operator=(const GradDrain&) = delete;

  // The next slot, once its previous drain is done.
  int acquire();
  // Drains `bytes` of the slot acquire() returned last into host_dst.
  void submit(void* host_dst, std::size_t bytes);
  // Blocks until every submitted drain completed; the first copy error, if any.
  Status flush();
  std::uint64_t bytes() const;

 private:
  struct Job {
    void* dst = nullptr;
    std::size_t bytes = 0;
  };
  GradDrain(std::vector<void*> slots, mem::TransferEngine& engine, mem::Stream& d2h,
            mem::Stream& compute, std::vector<mem::Event> ready);
  void run();

  std::vector<void*> slots_;
  mem::TransferEngine& engine_;
  mem::Stream& d2h_;
  mem::Stream& compute_;
  std::vector<mem::Event> ready_;  // [slot]: recorded on compute at submit
  std::vector<Job> jobs_;          // [slots], job n in jobs_[n % slots]
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t submitted_ = 0, done_ = 0, acquired_ = 0;
  std::uint64_t bytes_ = 0;
  Status error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ferry::train::stream
