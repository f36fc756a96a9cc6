// SPDX-License-Identifier: Apache-2.0
// Opaque stream and event handles. Code outside kernels/cuda and mem/*_cuda.cpp sees only these,
// so the CPU-only build needs no CUDA headers. A CPU stream executes work synchronously at enqueue
// time; its events are always complete. Every function that enqueues work takes Stream& last.
//
// A Stream is a non-owning handle: StreamSet (stream_set.h) owns CUDA streams; Stream::host() is
// the process-wide synchronous host stream. Events (event.h) order work across streams:
//   FERRY_TRY(done.record(h2d));  FERRY_TRY(compute.wait(done));
#pragma once

#include "core/device.h"
#include "core/status.h"

namespace ferry::mem {

class Event;

class Stream {
 public:
  // The synchronous host stream used by CPU backends and CPU transfer engines.
  static Stream& host();

  Stream() = default;
  Stream(Device device, int device_index, void* native)
      : device_(device), device_index_(device_index), native_(native) {}

  Device device() const { return device_; }
  int device_index() const { return device_index_; }
  // cudaStream_t for CUDA streams (owned by whoever created the Stream); nullptr for host.
  void* native() const { return native_; }

  // Work enqueued on this stream after the call waits until `event` has completed (device-side
  // for CUDA streams; a host stream blocks the caller until a CUDA event completes, and host
  // events are always complete).
  Status wait(const Event& event);
  // Blocks the caller until all work enqueued so far has finished (no-op for host streams).
  Status synchronize();

 private:
  Device device_ = Device::kCpu;
  int device_index_ = 0;
  void* native_ = nullptr;
};

}  // namespace ferry::mem
