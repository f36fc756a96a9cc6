// SPDX-License-Identifier: Apache-2.0
// StreamSet: the three streams of one device — compute, h2d, d2h — plus one event per stream, RAII.
// CUDA: three non-blocking cudaStreams; CPU: three host streams (work runs at enqueue time and
// events are always complete), so executors built on a StreamSet run unchanged in CI.
//
//   FERRY_ASSIGN_OR_RETURN(StreamSet ss, StreamSet::create(Device::kCuda, 0));
//   FERRY_TRY(engine.h2d(d_w, h_w, bytes, ss.h2d()));
//   FERRY_TRY(ss.order(ss.h2d(), ss.compute()));   // compute waits for the copy, host does not
//
// Invariant: the Stream& references handed out stay valid for the StreamSet's lifetime, also
// across moves (the streams live behind a stable pointer). Streams are destroyed only after
// synchronizing them, so destroying a StreamSet never frees memory out from under queued work.
#pragma once

#include <array>
#include <memory>

#include "core/result.h"
#include "mem/event.h"
#include "mem/stream.h"

namespace ferry::mem {

class StreamSet {
 public:
  enum Role : int { kCompute = 0, kH2d = 1, kD2h = 2 };

  static Result<StreamSet> create(Device device, int device_index = 0);

  StreamSet(StreamSet&&) noexcept = default;
  StreamSet& operator=(StreamSet&&) noexcept = default;
  ~StreamSet();

  Stream& compute() { return state_->streams[kCompute]; }
  Stream& h2d() { return state_->streams[kH2d]; }
  Stream& d2h() { return state_->streams[kD2h]; }
  Stream& stream(Role r) { return state_->streams[r]; }
  Device device() const { return state_->device; }
  int device_index() const { return state_->device_index; }

  // Work enqueued on `consumer` after this call waits for all work enqueued on `producer` before
  // it (records producer's event, then consumer.wait). Both must belong to this set.
  Status order(Stream& producer, Stream& consumer);
  // Blocks the caller until all three streams are idle.
  Status synchronize();

 private:
  struct State {
    Device device = Device::kCpu;
    int device_index = 0;
    std::array<Stream, 3> streams;
    std::array<Event, 3> events;
    ~State();
  };
  StreamSet() = default;
  int role_of(const Stream& s) const;
  std::unique_ptr<State> state_;
};

}  // namespace ferry::mem
