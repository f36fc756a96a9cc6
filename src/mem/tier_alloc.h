// SPDX-License-Identifier: Apache-2.0
// Raw per-tier allocation primitives behind Buffer (buffer.h). Internal to mem/: callers use
// Buffer/Arena, which also charge the MemoryBudget. No budget accounting happens here.
//
// Two implementations of the device and pinned primitives are linked, never both:
//   tier_alloc_cuda.cpp         cudaMalloc / cudaHostAlloc / mmap + cudaHostRegister
//   nocuda/tier_alloc_nocuda.cpp an emulated device tier (aligned host memory) and plain mmap'd
//                               "pinned" pages, so pagers and executors run unchanged in CI.
// host_alloc.cpp holds the host primitives both use.
//
// Invariants: every non-null pointer returned here is at least kMinAlignBytes aligned; a pointer
// is freed by the matching *_free with the same size/mode it was allocated with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/result.h"

namespace ferry::mem {

// How kPinnedHost memory is obtained in CUDA builds (buffer.h explains when to pick which).
enum class PinnedMode : std::uint8_t {
  kHostAlloc,  // cudaHostAlloc (optionally write-combined)
  kRegister,   // mmap of exactly the rounded-up pages, faulted in on every thread, then
               // cudaHostRegister
};
// "hostalloc" / "register"; anything else nullopt.
std::optional<PinnedMode> parse_pinned_mode(std::string_view s);
// The mode for large host arenas (train/stream's HostArena): FERRY_PINNED_MODE=register|hostalloc
// in the environment (read once). Unset: kRegister, not explicit — the caller falls back to
// kHostAlloc when registration fails (H200, 7B arena of 63 GiB: cudaHostAlloc 22.7 s, register
// 2.5 s, the same step time; docs/train.md). An unknown value is warned about and treated as unset.
struct LargeArenaPinning {
  PinnedMode mode = PinnedMode::kRegister;
  bool explicit_choice = false;  // set by FERRY_PINNED_MODE: no fallback
};
LargeArenaPinning large_arena_pinned_mode();

namespace detail {

inline constexpr std::size_t kPageBytes = 4096;
inline constexpr std::size_t kMinAlignBytes = 256;

constexpr std::size_t align_up(std::size_t n, std::size_t align) {
  return (n + align - 1) / align * align;
}

// Host primitives (host_alloc.cpp). `what` names the requester in error messages.
Result<std::byte*> pageable_alloc(std::size_t bytes, std::string_view what);
void pageable_free(std::byte* p);
Result<std::byte*> map_pages(std::size_t bytes, std::string_view tier, std::string_view what);
void unmap_pages(std::byte* p, std::size_t bytes);
// Faults in map_pages' pages before they are pinned, on every thread of ThreadPool::global()
// (transparent huge pages requested first, where the kernel allows them): the kernel zeroes each
// page on its first touch, and cudaHostRegister then pins pages that are already there, instead
// of one driver thread faulting and zeroing tens of GB (a 7B training arena). Writes zeros.
void prefault_pages(std::byte* p, std::size_t bytes);

// Device tier. In CPU builds: emulated with host memory.
Result<std::byte*> device_alloc(std::size_t bytes, int device, std::string_view what);
void device_free(std::byte* p, std::size_t bytes, int device);
bool device_tier_emulated();

// Pinned host tier. write_combined applies to kHostAlloc only (host-written, device-read staging).
Result<std::byte*> pinned_alloc(std::size_t bytes, PinnedMode mode, bool write_combined,
                                std::string_view what);
void pinned_free(std::byte* p, std::size_t bytes, PinnedMode mode);

}  // namespace detail
}  // namespace ferry::mem
