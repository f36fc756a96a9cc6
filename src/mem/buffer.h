// SPDX-License-Identifier: Apache-2.0
// Buffer: move-only RAII owner of bytes in exactly one memory tier, charged to that tier's
// MemoryBudget for its whole life.
//
//   MemoryBudget vram(MemTier::kDevice, 24ull << 30);
//   FERRY_ASSIGN_OR_RETURN(Buffer b, Buffer::allocate(MemTier::kDevice, bytes, vram,
//                                                     {.what = "kv blocks"}));
//
// Invariants:
//   - allocate() charges exactly `bytes` to the budget before touching the allocator and refunds
//     it if the allocator fails; the destructor frees the memory and releases the charge.
//   - the budget must outlive every Buffer charged to it (checked nowhere; review checks it).
//   - data() is at least 256-byte aligned (host tiers: page aligned); a zero-byte Buffer is empty
//     (data() == nullptr) and charges nothing.
//   - kMappedFile (model/ owns file mappings) and kNvme (NvmeStore) are not Buffer tiers:
//     allocate() returns invalid_argument for them.
//
// Tiers by build:
//   kDevice       CUDA: cudaMalloc on opts.device. CPU: emulated with aligned host memory.
//   kPinnedHost   CUDA: cudaHostAlloc (PinnedMode::kHostAlloc, the default; optional
//                 write-combined for host-written, device-read staging) or mmap + cudaHostRegister
//                 (kRegister). CPU: mmap'd pages. Both modes keep the charge exact-size.
//   kPageableHost page-aligned malloc.
//
// Why two pinned modes: cudaHostAlloc is the simple path and the only one that offers
// write-combined memory; mmap + cudaHostRegister lets us choose the pages ourselves (exactly the
// rounded-up size, madvise/hugepages, NUMA placement) and pin memory whose layout was decided
// before CUDA saw it, and faulting the pages in on every thread first pinned a 63 GiB arena ~9x
// faster than one cudaHostAlloc on the H200 (2.5 vs 22.7 s). Registering can also fail where
// cudaHostAlloc succeeds (RLIMIT_MEMLOCK), so the mode is an option: BufferOptions defaults to
// kHostAlloc; the train host arena defaults to kRegister and falls back
// (mem::large_arena_pinned_mode).
#pragma once

#include <cstddef>
#include <string_view>

#include "core/result.h"
#include "mem/budget.h"
#include "mem/tier.h"
#include "mem/tier_alloc.h"

namespace ferry::mem {

struct BufferOptions {
  int device = 0;                                   // kDevice: CUDA device index
  PinnedMode pinned_mode = PinnedMode::kHostAlloc;  // kPinnedHost only
  bool write_combined = false;                      // kPinnedHost + kHostAlloc only
  std::string_view what = "buffer";                 // names the requester in error messages
};

class Buffer {
 public:
  // Charges `budget` (whose tier must be `tier`: a mismatch is a bug) and allocates. Out of budget
  // or out of memory: resource_exhausted naming tier, request and free bytes.
  static Result<Buffer> allocate(MemTier tier, std::size_t bytes, MemoryBudget& budget,
                                 const BufferOptions& opts = {});

  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  MemTier tier() const { return tier_; }
  int device() const { return device_; }
  bool empty() const { return data_ == nullptr; }
  // True when kDevice memory is host memory standing in for a GPU (CPU builds).
  bool emulated() const { return tier_ == MemTier::kDevice && detail::device_tier_emulated(); }

  // Frees now (as the destructor would); the Buffer becomes empty.
  void reset();

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  MemTier tier_ = MemTier::kPageableHost;
  int device_ = 0;
  PinnedMode pinned_mode_ = PinnedMode::kHostAlloc;
  MemoryBudget* budget_ = nullptr;
};

}  // namespace ferry::mem
