// SPDX-License-Identifier: Apache-2.0
#include "mem/pinned_ring.h"

#include "core/check.h"

namespace ferry::mem {

Result<PinnedRing> PinnedRing::create(const PinnedRingOptions& opts, MemoryBudget& pinned_budget) {
  if (opts.slots == 0 || opts.slot_bytes == 0) {
    return invalid_argument("mem: pinned ring needs slots > 0 and slot_bytes > 0 (got {} x {})",
                            opts.slots, opts.slot_bytes);
  }
  PinnedRing r;
  r.slot_bytes_ = opts.slot_bytes;
  r.slot_stride_ = detail::align_up(opts.slot_bytes, detail::kPageBytes);
  FERRY_ASSIGN_OR_RETURN(
      r.buffer_, Buffer::allocate(MemTier::kPinnedHost, r.slot_stride_ * opts.slots, pinned_budget,
                                  opts.buffer));
  r.slots_.resize(opts.slots);
  for (Slot& s : r.slots_) {
    FERRY_ASSIGN_OR_RETURN(s.done, Event::create(opts.event_device, opts.device_index));
  }
  return r;
}

PinnedRing::Slot& PinnedRing::at(std::size_t slot) {
  FERRY_CHECK(slot < slots_.size(), "mem: pinned ring slot {} out of range ({} slots)", slot,
              slots_.size());
  return slots_[slot];
}

std::byte* PinnedRing::data(std::size_t slot) const {
  FERRY_CHECK(slot < slots_.size(), "mem: pinned ring slot {} out of range ({} slots)", slot,
              slots_.size());
  return buffer_.data() + slot * slot_stride_;
}

SlotState PinnedRing::state(std::size_t slot) const {
  FERRY_CHECK(slot < slots_.size(), "mem: pinned ring slot {} out of range ({} slots)", slot,
              slots_.size());
  return slots_[slot].state;
}

Result<bool> PinnedRing::try_reclaim(std::size_t slot) {
  Slot& s = at(slot);
  if (s.state == SlotState::kFree) return true;
  if (s.state != SlotState::kInUse || !s.release_recorded) return false;
  FERRY_ASSIGN_OR_RETURN(const bool done, s.done.query());
  if (!done) return false;
  transition(s.state, SlotState::kFree, slot);
  s.release_recorded = false;
  return true;
}

Status PinnedRing::reclaim() {
  for (std::size_t i = 0; i < slots_.size(); ++i) FERRY_TRY(try_reclaim(i).status());
  return {};
}

Result<std::optional<std::size_t>> PinnedRing::try_acquire() {
  FERRY_ASSIGN_OR_RETURN(const bool free, try_reclaim(next_));
  if (!free) return std::optional<std::size_t>{};
  const std::size_t slot = next_;
  transition(slots_[slot].state, SlotState::kLoading, slot);
  next_ = (next_ + 1) % slots_.size();
  return std::optional<std::size_t>{slot};
}

Result<std::size_t> PinnedRing::acquire() {
  Slot& s = slots_[next_];
  if (s.state == SlotState::kInUse && s.release_recorded) FERRY_TRY(s.done.synchronize());
  FERRY_ASSIGN_OR_RETURN(std::optional<std::size_t> slot, try_acquire());
  if (!slot.has_value()) {
    return resource_exhausted(
        "mem: pinned ring: next slot {} of {} is {}{}; the ring is smaller "
        "than the pipeline using it",
        next_, slots_.size(), to_string(s.state),
        s.state == SlotState::kInUse ? " without end_use()" : "");
  }
  return *slot;
}

void PinnedRing::mark_ready(std::size_t slot) {
  transition(at(slot).state, SlotState::kReady, slot);
}

void PinnedRing::discard(std::size_t slot) {
  Slot& s = at(slot);
  FERRY_CHECK(s.state == SlotState::kReady,
              "mem: illegal slot transition {} -> free (discard, "
              "slot {})",
              to_string(s.state), slot);
  transition(s.state, SlotState::kFree, slot);
}

void PinnedRing::begin_use(std::size_t slot) {
  transition(at(slot).state, SlotState::kInUse, slot);
}

Status PinnedRing::end_use(std::size_t slot, Stream& consumer) {
  Slot& s = at(slot);
  FERRY_CHECK(s.state == SlotState::kInUse && !s.release_recorded,
              "mem: end_use on slot {} in state {}{}", slot, to_string(s.state),
              s.release_recorded ? " (already released)" : "");
  FERRY_TRY(s.done.record(consumer));
  s.release_recorded = true;
  return {};
}

}  // namespace ferry::mem
