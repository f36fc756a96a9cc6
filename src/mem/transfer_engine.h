// SPDX-License-Identifier: Apache-2.0
// TransferEngine: moves bytes between tiers — host→device, device→host, device→device on caller
// streams (Stream& last), host↔NVMe through an NvmeStore with tickets. Completion is observed
// with Events recorded after the copies (event.h) or by waiting on NVMe tickets.
//
//   TransferEngine& te = *engine;                               // cuda_transfer_engine(0) or host
//   FERRY_TRY(te.h2d(d_layer, h_layer, bytes, ss.h2d()));
//   FERRY_TRY(slot_ready.record(ss.h2d()));                      // compute waits on slot_ready
//
// Implementations:
//   host_transfer_engine()    memcpy on host streams: the copy has happened when the call returns
//                             and every event recorded after it is complete. With the CPU build's
//                             emulated device tier this runs executors unchanged in CI.
//   cuda_transfer_engine(dev) cudaMemcpyAsync on the caller's CUDA stream; asynchronous. Host
//                             memory should be kPinnedHost, or the driver stages it synchronously
//                             (about 7x slower on the measured H200 host).
// Contract: source and destination stay valid (and the source unmodified) until an event
// recorded after the copy has completed. Passing a stream of the wrong device type is a bug.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/device.h"
#include "core/result.h"
#include "mem/nvme_store.h"
#include "mem/stream.h"

namespace ferry::mem {

enum class CopyKind : std::uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };

struct TransferCounters {
  std::atomic<std::uint64_t> h2d_bytes{0}, d2h_bytes{0}, d2d_bytes{0};
  std::atomic<std::uint64_t> nvme_write_bytes{0}, nvme_read_bytes{0};
};

class TransferEngine {
 public:
  virtual ~TransferEngine() = default;
  virtual Device device() const = 0;

  // Enqueues one copy of `bytes` on `stream`.
  virtual Status copy(void* dst, const void* src, std::size_t bytes, CopyKind kind,
                      Stream& stream) = 0;

  // Sets `bytes` bytes at dst (device-tier memory) to zero, enqueued on `stream`.
  virtual Status zero(void* dst, std::size_t bytes, Stream& stream) = 0;

  Status h2d(void* d_dst, const void* h_src, std::size_t bytes, Stream& stream) {
    return copy(d_dst, h_src, bytes, CopyKind::kHostToDevice, stream);
  }
  Status d2h(void* h_dst, const void* d_src, std::size_t bytes, Stream& stream) {
    return copy(h_dst, d_src, bytes, CopyKind::kDeviceToHost, stream);
  }
  Status d2d(void* d_dst, const void* d_src, std::size_t bytes, Stream& stream) {
    return copy(d_dst, d_src, bytes, CopyKind::kDeviceToDevice, stream);
  }

  // Host <-> NVMe: asynchronous on the store's I/O path; complete with nvme_wait().
  Result<NvmeTicket> host_to_nvme(NvmeStore& store, RecordId id, const std::byte* h_src);
  Result<NvmeTicket> nvme_to_host(NvmeStore& store, RecordId id, std::byte* h_dst);
  Status nvme_wait(NvmeStore& store, NvmeTicket ticket) { return store.wait(ticket); }

  const TransferCounters& counters() const { return counters_; }

 protected:
  void count(CopyKind kind, std::size_t bytes);
  TransferCounters counters_;
};

// The process-wide synchronous host engine (always available).
TransferEngine& host_transfer_engine();

// A CUDA engine for device `device`: unavailable in CPU builds or without that device.
Result<std::unique_ptr<TransferEngine>> cuda_transfer_engine(int device);

}  // namespace ferry::mem
