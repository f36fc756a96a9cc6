// SPDX-License-Identifier: Apache-2.0
// NvmeReadAhead: the backward's NVMe-homed boundaries read back from disk ahead of need, in fetch
// order, on a thread of its own, into pinned staging buffers that take turns.
//
// Why: the plan (src/plan/evaluate.cpp) hides an NVMe fetch's disk read behind the compute of the
// windows before the span that needs it. Read on the compute thread at the fetch's issue point,
// the read blocked the host with only the current layer's kernels queued, and each fetch exposed
// ~55-60 ms of its ~100 ms read (docs/plan.md, "Session 35"). Here the disk works while the compute
// thread goes on queueing: with k buffers, read m starts as soon as buffer m % k is free, i.e.
// once the H2D that consumed read m - k has completed on its stream (the event the caller
// recorded after enqueueing that copy). The executor passes one buffer (the planner charges one
// record of host memory, src/plan/problem.h nvme_bounce_gb); a second would let read m + 1 run
// while read m waits for its fetch buffer.
//
//   NvmeReadAhead ra(store, {stage}, {&free});
//   ra.begin(records);                 // the backward's NVMe fetches, in fetch order
//   for m ...: auto t = ra.take(m);   // blocks until read m has landed
//              ...enqueue the H2D from t->data; record free[m % k] after it...;
//              ra.release(m);          // read m + k may start once free[m % k] completes
//
// begin() waits for a previous sequence's read in progress, and drops what it had not started
// (an aborted micro-batch); begin({}) only that (before the buffers are used for anything else);
// the destructor does the same. The NvmeStore is used by this thread
// only between begin() and the last take(): the executor's stores (the forward) use the buffer
// on the compute thread, before begin() and after every read was taken.
// Threading: begin / take / release from one thread (the executor's compute thread).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/result.h"
#include "mem/event.h"
#include "mem/nvme_store.h"

namespace ferry::train::stream {

class NvmeReadAhead {
 public:
  struct Landed {
    std::byte* data = nullptr;  // staging buffer m % k, holding the record
    double disk_s = 0.0;        // the read's own time (not the waits before it)
  };

  // staging: k >= 1 buffers of store.record_stride() bytes, NvmeStore-aligned; staging_free[i]:
  // the event the caller records after enqueueing the copy out of buffer i.
  NvmeReadAhead(mem::NvmeStore& store, std::vector<std::byte*> staging,
                std::vector<const mem::Event*> staging_free);
  ~NvmeReadAhead();
  NvmeReadAhead(const NvmeReadAhead&) = delete;
  NvmeReadAhead& operator=(const NvmeReadAhead&) = delete;

  // A new sequence of reads, in the order they will be taken; both buffers are free.
  void begin(std::vector<mem::RecordId> records);
  // Blocks until read m of the sequence has landed; its status (a disk error) otherwise. m must be
  // the next one not yet taken.
  Result<Landed> take(int m);
  // The copy out of read m's buffer is enqueued and staging_free[m % k] recorded after it.
  void release(int m);

 private:
  void run();
  // Stops the current sequence: the read in progress finishes, nothing further starts.
  void drain_locked(std::unique_lock<std::mutex>& lock);

  mem::NvmeStore& store_;
  std::vector<std::byte*> staging_;
  std::vector<const mem::Event*> staging_free_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<mem::RecordId> records_;
  std::vector<Status> status_;  // [m]: read m's outcome, once landed
  std::vector<double> disk_s_;  // [m]
  int landed_ = 0;              // reads 0 .. landed_-1 have landed
  int released_ = 0;            // reads 0 .. released_-1 were released
  int taken_ = 0;
  bool reading_ = false;  // the thread is inside a read (or its event wait)
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ferry::train::stream
