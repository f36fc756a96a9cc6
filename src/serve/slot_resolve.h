// SPDX-License-Identifier: Apache-2.0
// Device-side slot resolution for paged decode (docs/serve.md "Device-side slot resolution"):
// the LRU, LFU or LFRU decisions of ExpertPager::acquire made over plain arrays (the layout of
// kernels/cuda/serve_kernel_args.h SlotResolveArgs), so the CUDA engine can make them on the
// device, stream-ordered, with no host wait, and a decode step can be a CUDA graph.
//   resolve_slots_twin   the CPU twin of the resolve kernel (serve_slot_resolve.cu): the spec,
//                        sequential, readable; the kernel must make the same decisions
//   copy_misses_twin     the CPU twin of the miss-copy kernel (memcpy of each logged miss)
//   fill_slot_state      writes a layer's state and table from the host pager (the pager is the
//                        truth between device steps; after host-path steps the device state is
//                        rewritten from it)
// Invariant (tests/unit/serve/slot_resolve_test.cpp): on any routing sequence, the twin's
// decisions (slot of every expert, misses, evictions, their order) equal the host pager's under
// LRU, LFU and LFRU with the same caps and hot set; the kernel equals the twin (tests/gpu/
// serve_device_resolve_gpu_test.cpp).
#pragma once

#include <cstdint>
#include <span>

#include "kernels/cuda/serve_kernel_args.h"
#include "serve/expert_pager.h"

namespace ferry::serve {

using kernels::cuda::MissCopyArgs;
using kernels::cuda::SlotResolveArgs;
using kernels::cuda::SlotStateLayout;

// Views of one layer's state block (SlotResolveArgs::state).
struct SlotStateView {
  std::int32_t* base = nullptr;
  int E = 0, max_cap = 0;
  std::int32_t& cap() const { return base[0]; }
  std::uint32_t& tick() const { return reinterpret_cast<std::uint32_t*>(base)[1]; }
  std::int32_t& rule() const { return base[2]; }  // kSlotRuleLru / kSlotRuleLfu / kSlotRuleLfru
  std::int32_t& half_life() const { return base[3]; }  // LFRU's h, the decay table's length
  std::int32_t* slot_of() const { return base + SlotStateLayout::kHeader; }
  std::int32_t* expert_in() const { return slot_of() + E; }
  std::uint32_t* stamp() const { return reinterpret_cast<std::uint32_t*>(expert_in() + max_cap); }
  std::int32_t* flags() const { return expert_in() + 2 * max_cap; }
  std::uint32_t* uses() const {
    return reinterpret_cast<std::uint32_t*>(expert_in() + 3 * max_cap);
  }
  std::uint32_t* score_at() const {
    return reinterpret_cast<std::uint32_t*>(expert_in() + 4 * max_cap);
  }
  double* score() const {
    return reinterpret_cast<double*>(base + SlotStateLayout::score_offset(E, max_cap));
  }
};

// A resolve log's fields (SlotResolveArgs::log).
struct SlotLogView {
  const std::int32_t* base = nullptr;
  int E = 0;
  std::int32_t hits() const { return base[0]; }
  std::int32_t misses() const { return base[1]; }
  std::int32_t evictions() const { return base[2]; }
  std::int32_t errors() const { return base[3]; }
  std::int32_t n() const { return base[4]; }
  const std::int32_t* ids() const { return base + SlotStateLayout::kLogHeader; }
  const std::int32_t* miss_expert() const { return ids() + E; }
  const std::int32_t* miss_slot() const { return ids() + 2 * E; }
  const std::int32_t* evicted() const { return ids() + 3 * E; }
};

// expert_bytes, up_offset and down_offset of `a` for the store's block layout.
void set_block_layout(SlotResolveArgs& a, const ExpertStore& store);

// The CPU twin of the resolve kernel: one layer's call (see SlotResolveArgs).
void resolve_slots_twin(const SlotResolveArgs& a);
// The CPU twin of the miss-copy kernel.
void copy_misses_twin(const MissCopyArgs& a);

// Writes layer `layer`'s state block (state_ints(E, max_cap) ints; max_cap >= the layer's max
// capacity, slots above it empty; `state` 8-byte aligned) and its [3, E] table from the pager:
// caps, tick, residents, LRU stamps (last use) and hot flags, in-use flags clear (no layer in use:
// between steps). slot_base: the slots' address as the table should hold it. The victim rule is
// the pager's policy, with each slot's uses since load (LFU) and LFRU score, its tick and the
// half-life (the decay table is the pager's ranker().decay_table(), passed in the args).
// out_of_range when the layer's tick, a stamp or a use count no longer fits 32 bits (the caller
// keeps the host path then).
Status fill_slot_state(const ExpertPager& pager, const ExpertStore& store, int layer, int max_cap,
                       std::int32_t* state, const void** table, unsigned char* slot_base);

}  // namespace ferry::serve
