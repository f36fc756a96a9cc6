// SPDX-License-Identifier: Apache-2.0
// ArenaPlan / Arena: llm.c's "size table, then one allocation", with names.
//
//   ArenaPlan plan;                                     // 1. the size table, from config
//   const SlotId w = plan.add("layer0.weights", wbytes, 4096);
//   const SlotId a = plan.add("layer0.acts", abytes);
//   FERRY_ASSIGN_OR_RETURN(Arena arena, make_arena(plan, MemTier::kDevice, vram));  // 2. one
//   Buffer float* d_acts = arena.as<float>(a);                 // 3. views by SlotId
//
// Invariants:
//   - slots are laid out in add() order; slot i's offset is the smallest multiple of its alignment
//     at or after the end of slot i-1; alignments are powers of two (a bug otherwise).
//   - the Arena allocates exactly plan.allocation_bytes() from the budget: total_bytes() plus, when
//     some slot asks for more than the 256-byte alignment every tier guarantees, the padding needed
//     to align the base. This figure is what planners compare with their budget.
//   - views returned by an Arena never outlive it; a SlotId is only valid for the plan that made
//     it (out-of-range ids abort).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "mem/buffer.h"

namespace ferry::mem {

struct SlotId {
  std::uint32_t index = 0;
  friend bool operator==(SlotId, SlotId) = default;
};

struct ArenaSlot {
  std::string name;
  std::size_t offset_bytes = 0;  // from the aligned arena base
  std::size_t size_bytes = 0;
  std::size_t align_bytes = 0;
};

class ArenaPlan {
 public:
  // Appends a slot. Duplicate names and non-power-of-two alignments are bugs (abort).
  SlotId add(std::string_view name, std::size_t bytes, std::size_t align = 256);

  std::size_t total_bytes() const { return total_bytes_; }
  std::size_t max_align() const { return max_align_; }
  // What make_arena charges to the budget (total_bytes() + base-alignment padding).
  std::size_t allocation_bytes() const;
  std::size_t num_slots() const { return slots_.size(); }
  const ArenaSlot& slot(SlotId id) const;
  const std::vector<ArenaSlot>& slots() const { return slots_; }
  std::optional<SlotId> find(std::string_view name) const;

 private:
  std::vector<ArenaSlot> slots_;
  std::size_t total_bytes_ = 0;
  std::size_t max_align_ = detail::kMinAlignBytes;
};

class Arena {
 public:
  Arena() = default;
  Arena(Arena&&) noexcept = default;
  Arena& operator=(Arena&&) noexcept = default;

  std::byte* data(SlotId id) const { return base_ + plan_.slot(id).offset_bytes; }
  std::size_t size(SlotId id) const { return plan_.slot(id).size_bytes; }
  std::span<std::byte> bytes(SlotId id) const { return {data(id), size(id)}; }
  template <typename T>
  T* as(SlotId id) const {
    return reinterpret_cast<T*>(data(id));
  }

  const ArenaPlan& plan() const { return plan_; }
  std::optional<SlotId> find(std::string_view name) const { return plan_.find(name); }
  MemTier tier() const { return buffer_.tier(); }
  std::byte* base() const { return base_; }
  std::size_t total_bytes() const { return plan_.total_bytes(); }
  const Buffer& buffer() const { return buffer_; }

 private:
  friend Result<Arena> make_arena(const ArenaPlan&, MemTier, MemoryBudget&, const BufferOptions&);
  ArenaPlan plan_;
  Buffer buffer_;
  std::byte* base_ = nullptr;
};

// One Buffer of plan.allocation_bytes() in `tier`, charged to `budget`. Out of budget: the
// Buffer's resource_exhausted, prefixed with "arena".
Result<Arena> make_arena(const ArenaPlan& plan, MemTier tier, MemoryBudget& budget,
                         const BufferOptions& opts = {});

}  // namespace ferry::mem
