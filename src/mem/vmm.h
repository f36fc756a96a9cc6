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
//   *_up_front_*  the whole-up-front backing (VirtualRegion's fallback where a GPU or driver lacks
//                 VMM, or when asked for): one ordinary allocation of the whole range, every byte
//                 backed at once (host: mmap + a touch of every page; device: cudaMalloc, or
//                 host_up_front_* in the CPU build), so it holds what a pool at its maximum held
//                 before VMM.
// Invariants: `at` and `bytes` of map/unmap are multiples of the granularity the reservation was
// made with; a mapped range is unmapped with exactly the bytes and handle it was mapped with.
// Messages: the *_up_front_alloc errors are phrases ("need 4.00 GiB, free 1.20 GiB of 79.2 GiB on
// device 0 (cudaMalloc: cudaErrorMemoryAllocation)"), not sentences, because VirtualRegion embeds
// them in its own message naming the region and why it is backed up front.
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
Result<std::byte*> host_up_front_alloc(std::size_t bytes);
void host_up_front_free(std::byte* p, std::size_t bytes);
void host_vmm_free(std::byte* base, std::size_t bytes);
Status host_vmm_map(std::byte* at, std::size_t bytes, std::string_view what);
void host_vmm_unmap(std::byte* at, std::size_t bytes);

// kDevice. granularity: cuMemGetAllocationGranularity's minimum for `device` (CPU build:
// kHostVmmGranularity). map returns the physical allocation's handle (0 in the CPU build), which
// unmap releases. Mapped device memory is not zeroed. unavailable, from granularity, supported and
// reserve alike, means "no VMM here" (a driver without the entry points, a device whose
// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0, CUDA_ERROR_NOT_SUPPORTED): the
// caller may back the range up front instead; any other error is the device's own.
Result<std::size_t> device_vmm_granularity(int device);
// ok: `device` can commit granule by granule (always in the CPU build).
Status device_vmm_supported(int device);
Result<std::byte*> device_vmm_reserve(std::size_t bytes, std::size_t align, int device,
                                      std::string_view what);
void device_vmm_free(std::byte* base, std::size_t bytes, int device);
Result<std::uint64_t> device_vmm_map(std::byte* at, std::size_t bytes, int device,
                                     std::string_view what);
void device_vmm_unmap(std::byte* at, std::size_t bytes, std::uint64_t handle, int device);
// Not zeroed on a GPU (cudaMalloc); zeros in the CPU build.
Result<std::byte*> device_up_front_alloc(std::size_t bytes, int device);
void device_up_front_free(std::byte* p, std::size_t bytes, int device);

}  // namespace ferry::mem::detail
