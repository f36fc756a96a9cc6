// SPDX-License-Identifier: Apache-2.0
// Memory tiers. Every byte ferry owns lives in exactly one tier and is charged to that tier's
// MemoryBudget (budget.h).
//   kDevice        GPU memory (CUDA builds); in CPU builds an *emulated* device tier backed by host
//                  memory, so pagers and executors run unchanged in CI.
//   kPinnedHost    page-locked host memory (cudaHostAlloc, or mmap + cudaHostRegister); plain
//                  aligned memory in CPU builds.
//   kPageableHost  ordinary host memory.
//   kMappedFile    a read-only file mapping (safetensors); kNvme is the NVMe spill store.
#pragma once

#include <cstdint>
#include <string_view>

namespace ferry::mem {

enum class MemTier : std::uint8_t { kDevice, kPinnedHost, kPageableHost, kMappedFile, kNvme };
inline constexpr int kNumTiers = 5;

std::string_view to_string(MemTier t);

// True when kDevice is host memory (the emulated tier of CPU builds), i.e. CPU code may read and
// write device-tier buffers. False in CUDA builds, where kDevice is cudaMalloc'd GPU memory.
bool device_tier_is_host_memory();

}  // namespace ferry::mem
