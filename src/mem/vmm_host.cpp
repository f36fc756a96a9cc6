// SPDX-License-Identifier: Apache-2.0
// Host virtual reservations (vmm.h): address space with no access and no pages until a range is
// mapped. MAP_NORESERVE: reserving the maximum of a pool costs neither memory nor swap
// accounting. madvise(MADV_DONTNEED) on private anonymous memory drops the pages at once (they
// read as zeros when touched again), which is what makes an unmap give memory back; the
// PROT_NONE afterwards turns a stray access to a released range into a fault instead of a
// silent zero page. The whole-up-front backing (host_up_front_*) is the opposite: ordinary
// read/write pages, each touched at once, so the emulated tier holds the whole range from the
// start as cudaMalloc does on a card (and mincore can tell the two backings apart in tests).
#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"
#include "mem/budget.h"
#include "mem/tier_alloc.h"
#include "mem/vmm.h"

namespace ferry::mem::detail {

Result<std::byte*> host_vmm_reserve(std::size_t bytes, std::string_view what) {
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return resource_exhausted("mem: reserving {} of address space for {} failed (mmap: {})",
                              format_bytes(bytes), what, std::strerror(err));
  }
  return static_cast<std::byte*>(p);
}

Result<std::byte*> host_up_front_alloc(std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return resource_exhausted("need {} (mmap: {})", format_bytes(bytes), std::strerror(err));
  }
  prefault_pages(static_cast<std::byte*>(p), bytes);  // backed now, not on first use
  return static_cast<std::byte*>(p);
}

void host_up_front_free(std::byte* p, std::size_t bytes) {
  const int rc = ::munmap(p, bytes);
  FERRY_CHECK(rc == 0, "mem: munmap of a {}-byte up-front region failed: {}", bytes,
              std::strerror(errno));
}

void host_vmm_free(std::byte* base, std::size_t bytes) {
  const int rc = ::munmap(base, bytes);
  FERRY_CHECK(rc == 0, "mem: munmap of a {}-byte reservation failed: {}", bytes,
              std::strerror(errno));
}

Status host_vmm_map(std::byte* at, std::size_t bytes, std::string_view what) {
  if (::mprotect(at, bytes, PROT_READ | PROT_WRITE) != 0) {
    const int err = errno;
    return resource_exhausted("mem: committing {} for {} failed (mprotect: {})",
                              format_bytes(bytes), what, std::strerror(err));
  }
  return ok_status();
}

void host_vmm_unmap(std::byte* at, std::size_t bytes) {
  // Both calls act on a range we reserved and mapped: a failure is a bug.
  FERRY_CHECK(::madvise(at, bytes, MADV_DONTNEED) == 0, "mem: madvise(DONTNEED) of {} bytes: {}",
              bytes, std::strerror(errno));
  FERRY_CHECK(::mprotect(at, bytes, PROT_NONE) == 0, "mem: mprotect(NONE) of {} bytes: {}", bytes,
              std::strerror(errno));
}

}  // namespace ferry::mem::detail
