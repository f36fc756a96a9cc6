// SPDX-License-Identifier: Apache-2.0
// Raw virtual-memory primitives behind VirtualRegion (virtual_region.h): reserve address space,
// back a granule-aligned range of it with physical memory (map) and give that memory back
// (unmap). Internal to mem/: callers use VirtualRegion, which also charges the MemoryBudget. No
// budget accounting happens here.
//
// Two families, as in tier_alloc.h:
//   host_vmm_*    (vmm_host.cpp, every build) mmap(PROT_NONE) reservations; map = mprotect
//                 read/write, unmap = madvise(MADV_DONTNEED) + mprotect(PROT_NONE), so an unmapped
//                 range's pages really go back to the kernel and read as zeros when mapped again.
//   device_vmm_*  the kDevice tier: vmm_cuda.cpp (the CUDA virtual memory management API, entry
//                 points fetched through cudaGetDriverEntryPoint*, so libcuda is not linked) or
//                 nocuda/vmm_nocuda.cpp (the emulated device tier: host_vmm_*).
// Invariants: `at` and `bytes` of map/unmap are multiples of the granularity the reservation was
// made with; a mapped range is unmapped with exactly the bytes and handle it was mapped with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/result.h"

namespace ferry::mem::detail {

// The emulated (host) tiers' granule: the minimum allocation granularity CUDA reports on current
// GPUs, so a CPU build rounds exactly as the card does.
inline constexpr std::size_t kHostVmmGranularity = std::size_t{2} << 20;

Result<std::byte*> host_vmm_reserve(std::size_t bytes, std::string_view what);
void host_vmm_free(std::byte* base, std::size_t bytes);
Status host_vmm_map(std::byte* at, std::size_t bytes, std::string_view what);
void host_vmm_unmap(std::byte* at, std::size_t bytes);

// kDevice. granularity: cuMemGetAllocationGranularity's minimum for `device` (CPU build:
// kHostVmmGranularity). map returns the physical allocation's handle (0 in the CPU build), which
// unmap releases. Mapped device memory is not zeroed.
Result<std::size_t> device_vmm_granularity(int device);
Result<std::byte*> device_vmm_reserve(std::size_t bytes, std::size_t align, int device,
                                      std::string_view what);
void device_vmm_free(std::byte* base, std::size_t bytes, int device);
Result<std::uint64_t> device_vmm_map(std::byte* at, std::size_t bytes, int device,
                                     std::string_view what);
void device_vmm_unmap(std::byte* at, std::size_t bytes, std::uint64_t handle, int device);

}  // namespace ferry::mem::detail
