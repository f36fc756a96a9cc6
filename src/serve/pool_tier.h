// SPDX-License-Identifier: Apache-2.0
// The memory tier of the serving engine's "accelerator" pools: KV blocks, expert slots and the
// expert staging area, each under its own hard budget.
//
// Why not always MemTier::kDevice: the engine computes with the CPU backend, which can only
// address host memory. In CPU builds kDevice is the emulated (host-memory) device tier, so the
// pools are device-tier buffers exactly as a GPU engine's would be. In CUDA builds kDevice is
// cudaMalloc'd GPU memory — not writable by CPU code, and absent on CI machines without a GPU —
// so the CPU engine keeps the same pools, with the same budgets and accounting, in pageable host
// memory. A CUDA engine will pass kDevice.
#pragma once

#include "mem/tier.h"

namespace ferry::serve {

inline mem::MemTier cpu_engine_pool_tier() {
  return mem::device_tier_is_host_memory() ? mem::MemTier::kDevice : mem::MemTier::kPageableHost;
}

}  // namespace ferry::serve
