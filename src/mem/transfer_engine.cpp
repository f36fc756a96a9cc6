// SPDX-License-Identifier: Apache-2.0
// The host (memcpy) transfer engine and the NVMe forwarding shared by all engines.
#include "mem/transfer_engine.h"

#include <chrono>
#include <cstring>

#include "core/check.h"
#include "mem/link_pacer.h"

namespace ferry::mem {

void TransferEngine::count(CopyKind kind, std::size_t bytes) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      counters_.h2d_bytes += bytes;
      break;
    case CopyKind::kDeviceToHost:
      counters_.d2h_bytes += bytes;
      break;
    case CopyKind::kDeviceToDevice:
      counters_.d2d_bytes += bytes;
      break;
  }
}

Result<NvmeTicket> TransferEngine::host_to_nvme(NvmeStore& store, RecordId id,
                                                const std::byte* h_src) {
  FERRY_ASSIGN_OR_RETURN(NvmeTicket t, store.submit_write(id, h_src));
  counters_.nvme_write_bytes += store.record_stride();
  return t;
}

Result<NvmeTicket> TransferEngine::nvme_to_host(NvmeStore& store, RecordId id, std::byte* h_dst) {
  FERRY_ASSIGN_OR_RETURN(NvmeTicket t, store.submit_read(id, h_dst));
  counters_.nvme_read_bytes += store.record_stride();
  return t;
}

namespace {

class HostTransferEngine final : public TransferEngine {
 public:
  Device device() const override { return Device::kCpu; }
  Status copy(void* dst, const void* src, std::size_t bytes, CopyKind kind,
              Stream& stream) override {
    FERRY_CHECK(stream.device() == Device::kCpu, "mem: host transfer engine given a {} stream",
                to_string(stream.device()));
    if (bytes == 0) return {};
    FERRY_CHECK(dst != nullptr && src != nullptr, "mem: copy of {} bytes with a null pointer",
                bytes);
    const auto start = std::chrono::steady_clock::now();
    std::memmove(dst, src, bytes);
    // The emulated device tier's link (off unless a benchmark sets a rate: link_pacer.h).
    if (kind == CopyKind::kHostToDevice) pace_host_copy(start, bytes);
    count(kind, bytes);
    return {};
  }
  Status zero(void* dst, std::size_t bytes, Stream& stream) override {
    FERRY_CHECK(stream.device() == Device::kCpu, "mem: host transfer engine given a {} stream",
                to_string(stream.device()));
    if (bytes != 0) std::memset(dst, 0, bytes);
    return {};
  }
};

}  // namespace

TransferEngine& host_transfer_engine() {
  static HostTransferEngine engine;
  return engine;
}

}  // namespace ferry::mem
