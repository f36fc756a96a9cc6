// SPDX-License-Identifier: Apache-2.0
// Host memory primitives shared by the CUDA and CPU builds: aligned pageable memory and whole
// mmap'd pages (the base of exact-size pinned memory and of the CPU build's pinned tier).
#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "mem/budget.h"
#include "mem/tier_alloc.h"

namespace ferry::mem::detail {

Result<std::byte*> pageable_alloc(std::size_t bytes, std::string_view what) {
  // Page alignment keeps pageable buffers usable for O_DIRECT I/O and SIMD loads alike.
  void* p = std::aligned_alloc(kPageBytes, align_up(bytes, kPageBytes));
  if (p == nullptr) {
    return resource_exhausted("mem: pageable-host allocation failed for {}: need {} (malloc)", what,
                              format_bytes(bytes));
  }
  return static_cast<std::byte*>(p);
}

void pageable_free(std::byte* p) { std::free(p); }

Result<std::byte*> map_pages(std::size_t bytes, std::string_view tier, std::string_view what) {
  void* p = ::mmap(nullptr, align_up(bytes, kPageBytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return resource_exhausted("mem: {} allocation failed for {}: need {} (mmap: {})", tier, what,
                              format_bytes(bytes), std::strerror(err));
  }
  return static_cast<std::byte*>(p);
}

void unmap_pages(std::byte* p, std::size_t bytes) {
  const int rc = ::munmap(p, align_up(bytes, kPageBytes));
  FERRY_CHECK(rc == 0, "mem: munmap of {} bytes at {} failed: {}", bytes, static_cast<void*>(p),
              std::strerror(errno));
}

}  // namespace ferry::mem::detail
