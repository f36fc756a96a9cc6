// SPDX-License-Identifier: Apache-2.0
// VirtualRegion: a fixed range of addresses reserved once, whose physical memory is committed and
// decommitted in granules while the addresses stay where they are. A pool that MV-WSA resizes
// (expert slots, KV blocks) lays itself out for its largest size inside one region and commits
// only what its live size uses, so its real memory follows the split instead of the maximum, and
// every pointer into it (slot tables, KV layouts) stays valid across resizes.
//
//   MemoryBudget vram(MemTier::kDevice, 24ull << 30);
//   FERRY_ASSIGN_OR_RETURN(VirtualRegion r, VirtualRegion::reserve(MemTier::kDevice, 64ull << 30,
//                                                                  vram, {.what = "kv pool"}));
//   FERRY_TRY(r.commit(0, used_bytes));          // granules under [0, used) get memory
//   FERRY_TRY(r.decommit(used_bytes, r.size() - used_bytes));  // granules wholly above go back
//
// Granules: granularity() bytes: by default the tier's (CUDA: cuMemGetAllocationGranularity's
// minimum, 2 MiB on current GPUs; host tiers, the emulated device tier included: 2 MiB too, so
// CPU builds round as the card does), or one asked for: on a GPU a multiple of the driver's, in
// host memory a multiple of the 4 KiB page (tests use small ones). commit() rounds its range OUT to
// whole granules (everything asked for is backed); decommit() rounds IN (only granules wholly
// inside the range go, so a neighbour's bytes in a shared granule survive). size() is the
// reservation rounded up to a granule. Budget: `budget` (whose tier must be the region's: a bug
// otherwise) is charged the committed granules' bytes and nothing for the reservation. A commit
// that would pass it returns the budget's resource_exhausted naming the region, and changes
// nothing; so does a commit the driver/kernel refuses (what the call had mapped is unmapped again).
// Contents: a committed granule keeps its bytes until it is decommitted; a granule committed
// again after a decommit reads zeros on the host tiers and undefined bytes on a GPU.
// Tiers: kDevice (CUDA: the virtual memory management API; CPU build: the emulated tier, host
// memory) and kPageableHost (the CPU engine's pools in a CUDA build). Others: invalid_argument.
// Backing (docs/mem_virtual_region.md): by default (RegionBacking::kAuto) granule by granule as
// above. Where that is impossible -- a GPU or driver without CUDA virtual memory management -- or
// asked for (RegionBacking::kWholeUpFront, or FERRY_VMM=off in the environment for kAuto regions),
// the region is ONE ordinary allocation of the whole reservation (cudaMalloc; host pages touched
// at once), every granule backed from reserve() on: what a pool at its maximum held before VMM.
// commit()/decommit()/is_committed() and the budget behave exactly as above (the same rounding,
// charge and refusals, contents kept; on the host tiers a re-committed granule reads zeros there
// too); only held_bytes() differs: the whole reservation instead of the committed granules. A
// fallback taken by kAuto is logged once per region (logger "mem", warn). data() is then aligned
// to the tier's allocation (256 bytes at least), not to a granule.
// Streams: decommit() does not wait for the device. The caller makes sure no queued work still
// reads or writes the range (synchronize the streams that may) before decommitting it.
// Not thread-safe. The budget must outlive the region. Tests: tests/unit/mem/virtual_region_test
// (host tiers), tests/gpu/mem_virtual_region_gpu_test.cpp (CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "mem/budget.h"
#include "mem/tier.h"

namespace ferry::mem {

// How a region's granules get physical memory (see the file comment).
enum class RegionBacking : std::uint8_t {
  kAuto,          // granule by granule where the tier can (VMM on a GPU; host memory); else, or
                  // with FERRY_VMM=off in the environment, whole up front
  kWholeUpFront,  // one ordinary allocation of the whole reservation, made by reserve()
};
std::string_view to_string(RegionBacking b);  // "auto", "whole-up-front"

struct VirtualRegionOptions {
  int device = 0;               // kDevice: CUDA device index
  std::size_t granularity = 0;  // 0: the tier's (tier_granularity); see the file comment
  std::string_view what = "virtual region";  // names the requester in error messages
  RegionBacking backing = RegionBacking::kAuto;
  // Tests: a whole-up-front allocation of more than this fails as the device's out of memory
  // would, so the fallback's error is testable without exhausting memory (0: no limit).
  std::size_t up_front_limit_bytes = 0;
};

class VirtualRegion {
 public:
  // The tier's default granule (kDevice on CUDA: asks the driver for `device`; where the device
  // has no VMM, the host tiers' 2 MiB, which then only sets the bookkeeping's rounding).
  static Result<std::size_t> tier_granularity(MemTier tier, int device = 0);
  // Reserves `bytes` (rounded up to a granule) of address space; nothing is committed or charged.
  // Backed whole up front (see the file comment): the allocation is made here, and if it cannot
  // be, resource_exhausted names the region, why it is backed up front and the bytes needed (and
  // free, where the driver tells).
  static Result<VirtualRegion> reserve(MemTier tier, std::size_t bytes, MemoryBudget& budget,
                                       const VirtualRegionOptions& opts = {});

  VirtualRegion() = default;
  VirtualRegion(VirtualRegion&& other) noexcept;
  VirtualRegion& operator=(VirtualRegion&& other) noexcept;
  VirtualRegion(const VirtualRegion&) = delete;
  VirtualRegion& operator=(const VirtualRegion&) = delete;
  ~VirtualRegion();

  // Backs every granule touching [offset, offset + bytes). invalid_argument: the range leaves
  // the region; resource_exhausted: the budget or the device cannot take it (nothing changed).
  Status commit(std::size_t offset, std::size_t bytes);
  // Releases every committed granule wholly inside [offset, offset + bytes) and its charge.
  // invalid_argument: the range leaves the region (nothing changed).
  Status decommit(std::size_t offset, std::size_t bytes);
  // Whether every granule touching [offset, offset + bytes) is committed (false out of range).
  bool is_committed(std::size_t offset, std::size_t bytes) const;

  std::byte* data() const { return base_; }
  std::size_t size() const { return size_; }
  std::size_t granularity() const { return gran_; }
  std::size_t committed_bytes() const { return committed_granules_ * gran_; }
  std::size_t peak_committed_bytes() const { return peak_granules_ * gran_; }
  // Whether every granule is backed from reserve() on (RegionBacking, the file comment).
  bool backed_up_front() const { return up_front_; }
  // Memory really held: the committed granules, or the whole reservation when backed up front.
  std::size_t held_bytes() const { return up_front_ ? size_ : committed_bytes(); }
  MemTier tier() const { return tier_; }
  int device() const { return device_; }
  bool empty() const { return base_ == nullptr; }

  // Decommits everything and frees the reservation (as the destructor does); becomes empty.
  void reset();

 private:
  Status check_range(std::size_t offset, std::size_t bytes) const;
  void unmap_granule(std::size_t g);
  Status reserve_up_front(const VirtualRegionOptions& opts, std::string_view why);

  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
  std::size_t gran_ = 0;
  MemTier tier_ = MemTier::kPageableHost;
  int device_ = 0;
  MemoryBudget* budget_ = nullptr;
  std::string what_;
  std::vector<std::uint8_t> committed_;  // [size / granularity]
  std::vector<std::uint64_t> handle_;    // [size / granularity]: the granule's physical memory
                                         // (empty when backed up front)
  bool up_front_ = false;                // one allocation of the whole range, made at reserve()
  std::size_t committed_granules_ = 0, peak_granules_ = 0;
};

}  // namespace ferry::mem
