// SPDX-License-Identifier: Apache-2.0
// Host memory primitives shared by the CUDA and CPU builds: aligned pageable memory and whole
// mmap'd pages (the base of exact-size pinned memory and of the CPU build's pinned tier).
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "mem/budget.h"
#include "mem/tier_alloc.h"

namespace ferry::mem {

std::optional<PinnedMode> parse_pinned_mode(std::string_view s) {
  if (s == "hostalloc") return PinnedMode::kHostAlloc;
  if (s == "register") return PinnedMode::kRegister;
  return std::nullopt;
}

LargeArenaPinning large_arena_pinned_mode() {
  static const LargeArenaPinning choice = [] {
    const char* e = std::getenv("FERRY_PINNED_MODE");
    if (e == nullptr) return LargeArenaPinning{};
    const std::optional<PinnedMode> m = parse_pinned_mode(e);
    if (!m) {
      log::get("mem")->warn("FERRY_PINNED_MODE={} is not hostalloc or register: the default", e);
      return LargeArenaPinning{};
    }
    return LargeArenaPinning{.mode = *m, .explicit_choice = true};
  }();
  return choice;
}

}  // namespace ferry::mem

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

void prefault_pages(std::byte* p, std::size_t bytes) {
  const std::size_t mapped = align_up(bytes, kPageBytes);
#ifdef MADV_HUGEPAGE
  // Advice only: without THP (or where p is not 2 MiB aligned) the pages stay 4 KiB.
  ::madvise(p, mapped, MADV_HUGEPAGE);
#endif
  // 2 MiB pieces: a huge page is touched by one thread.
  constexpr std::size_t kPiece = std::size_t{2} << 20;
  ThreadPool::global().parallel_for(
      (mapped + kPiece - 1) / kPiece, [&](std::size_t c0, std::size_t c1) {
        for (std::size_t c = c0; c < c1; ++c) {
          const std::size_t begin = c * kPiece, end = std::min(mapped, begin + kPiece);
          for (std::size_t o = begin; o < end; o += kPageBytes) p[o] = std::byte{0};
        }
      });
}

void unmap_pages(std::byte* p, std::size_t bytes) {
  const int rc = ::munmap(p, align_up(bytes, kPageBytes));
  FERRY_CHECK(rc == 0, "mem: munmap of {} bytes at {} failed: {}", bytes, static_cast<void*>(p),
              std::strerror(errno));
}

}  // namespace ferry::mem::detail
