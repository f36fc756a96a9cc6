// SPDX-License-Identifier: Apache-2.0
// ArenaPlan layout (offsets in add() order) and make_arena (one Buffer, aligned base).
#include "mem/arena.h"

#include <cstdint>

#include "core/check.h"

namespace ferry::mem {

SlotId ArenaPlan::add(std::string_view name, std::size_t bytes, std::size_t align) {
  FERRY_CHECK(align != 0 && (align & (align - 1)) == 0,
              "arena: slot '{}' alignment {} is not a "
              "power of two",
              name, align);
  FERRY_CHECK(!find(name).has_value(), "arena: duplicate slot name '{}'", name);
  const std::size_t offset = detail::align_up(total_bytes_, align);
  slots_.push_back({std::string(name), offset, bytes, align});
  total_bytes_ = offset + bytes;
  if (align > max_align_) max_align_ = align;
  return SlotId{static_cast<std::uint32_t>(slots_.size() - 1)};
}

std::size_t ArenaPlan::allocation_bytes() const {
  if (total_bytes_ == 0) return 0;
  return total_bytes_ + (max_align_ - detail::kMinAlignBytes);
}

const ArenaSlot& ArenaPlan::slot(SlotId id) const {
  FERRY_CHECK(id.index < slots_.size(), "arena: slot id {} out of range ({} slots)", id.index,
              slots_.size());
  return slots_[id.index];
}

std::optional<SlotId> ArenaPlan::find(std::string_view name) const {
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].name == name) return SlotId{static_cast<std::uint32_t>(i)};
  }
  return std::nullopt;
}

Result<Arena> make_arena(const ArenaPlan& plan, MemTier tier, MemoryBudget& budget,
                         const BufferOptions& opts) {
  Result<Buffer> b = Buffer::allocate(tier, plan.allocation_bytes(), budget, opts);
  if (!b.ok()) {
    return std::move(b).take_status().with_context(
        fmt::format("arena ({} slots, {})", plan.num_slots(), format_bytes(plan.total_bytes())));
  }
  Arena a;
  a.plan_ = plan;
  a.buffer_ = std::move(b).value();
  const auto raw = reinterpret_cast<std::uintptr_t>(a.buffer_.data());
  const std::size_t pad = detail::align_up(raw, plan.max_align()) - raw;
  FERRY_CHECK(pad + plan.total_bytes() <= a.buffer_.size() || plan.total_bytes() == 0,
              "arena: base padding {} exceeds reserve for alignment {}", pad, plan.max_align());
  a.base_ = a.buffer_.data() + pad;
  return a;
}

}  // namespace ferry::mem
