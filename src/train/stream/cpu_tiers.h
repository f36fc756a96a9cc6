// SPDX-License-Identifier: Apache-2.0
// The memory tiers of the stream executor while it computes with the CPU backend.
//
// In CPU builds these are the real tiers of the design: kDevice is the emulated device tier
// (host memory under its own budget) and kPinnedHost is mmap'd pages. In CUDA builds kDevice is
// cudaMalloc'd GPU memory the CPU kernels cannot address, and kPinnedHost needs a CUDA device
// (absent on CI machines) while buying nothing for CPU compute — so the CPU executor keeps the same
// layout, budgets and accounting in pageable host memory. The GPU executor will use kDevice and
// kPinnedHost directly. (serve/pool_tier.h makes the same choice for the serving engine.)
#pragma once

#include "mem/tier.h"

namespace ferry::train::stream {

inline mem::MemTier cpu_device_tier() {
  return mem::device_tier_is_host_memory() ? mem::MemTier::kDevice : mem::MemTier::kPageableHost;
}

inline mem::MemTier cpu_pinned_tier() {
  return mem::device_tier_is_host_memory() ? mem::MemTier::kPinnedHost
                                           : mem::MemTier::kPageableHost;
}

}  // namespace ferry::train::stream
