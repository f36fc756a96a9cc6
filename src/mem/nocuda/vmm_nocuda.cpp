// SPDX-License-Identifier: Apache-2.0
// CPU build: the emulated device tier's virtual reservations are host ones (vmm_host.cpp), with
// the GPU's 2 MiB granule, so device-tier VirtualRegions behave (and round) as on a card. The
// emulated tier always "has VMM"; its whole-up-front backing is the host one.
#include "mem/vmm.h"

namespace ferry::mem::detail {

Result<std::size_t> device_vmm_granularity(int device) {
  if (device != 0) {
    return invalid_argument("mem: emulated device tier has only device 0, not {}", device);
  }
  return kHostVmmGranularity;
}

Status device_vmm_supported(int device) {
  if (device != 0) {
    return invalid_argument("mem: emulated device tier has only device 0, not {}", device);
  }
  return ok_status();
}

Result<std::byte*> device_vmm_reserve(std::size_t bytes, std::size_t /*align*/, int device,
                                      std::string_view what) {
  if (device != 0) {
    return invalid_argument("mem: emulated device tier has only device 0, not {} (for {})", device,
                            what);
  }
  return host_vmm_reserve(bytes, what);
}

void device_vmm_free(std::byte* base, std::size_t bytes, int /*device*/) {
  host_vmm_free(base, bytes);
}

Result<std::uint64_t> device_vmm_map(std::byte* at, std::size_t bytes, int /*device*/,
                                     std::string_view what) {
  FERRY_TRY(host_vmm_map(at, bytes, what));
  return std::uint64_t{0};
}

void device_vmm_unmap(std::byte* at, std::size_t bytes, std::uint64_t /*handle*/, int /*device*/) {
  host_vmm_unmap(at, bytes);
}

Result<std::byte*> device_up_front_alloc(std::size_t bytes, int device) {
  if (device != 0) {
    return invalid_argument("mem: emulated device tier has only device 0, not {}", device);
  }
  return host_up_front_alloc(bytes);
}

void device_up_front_free(std::byte* p, std::size_t bytes, int /*device*/) {
  host_up_front_free(p, bytes);
}

}  // namespace ferry::mem::detail
