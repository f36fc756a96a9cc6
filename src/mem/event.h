// SPDX-License-Identifier: Apache-2.0
// Event: RAII marker recorded on a Stream; completes when all work enqueued on that stream before
// the record has finished (cudaEvent_t in CUDA builds). A host Event completes at record time,
// since host streams run work synchronously — so executors written against Event run unchanged
// on the CPU build. An Event never recorded counts as complete (CUDA's rule too).
//
// Reuse rule (style.md): a staging slot is free only after the event recorded after its last
// consumer has completed; pinned_ring.h enforces this with a slot state machine.
//
// Invariant: a CUDA event is recorded only on a CUDA stream of the same device (a bug otherwise).
#pragma once

#include "core/device.h"
#include "core/result.h"
#include "mem/stream.h"

namespace ferry::mem {

class Event {
 public:
  // Host events always succeed; CUDA events need a CUDA build (unavailable otherwise).
  // timing: the event carries a timestamp, for elapsed_ms (CUDA; host events have none).
  static Result<Event> create(Device device, int device_index = 0, bool timing = false);
  // Milliseconds between two completed timing CUDA events recorded in that order (GPU clock).
  static Result<float> elapsed_ms(const Event& start, const Event& end);

  Event() = default;  // a host event
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  Status record(Stream& stream);
  Result<bool> query() const;  // true when complete
  Status synchronize() const;  // blocks the caller until complete

  Device device() const { return device_; }
  int device_index() const { return device_index_; }
  void* native() const { return native_; }  // cudaEvent_t or nullptr

 private:
  Device device_ = Device::kCpu;
  int device_index_ = 0;
  void* native_ = nullptr;
};

}  // namespace ferry::mem
