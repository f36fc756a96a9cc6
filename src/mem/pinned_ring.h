// SPDX-License-Identifier: Apache-2.0
// PinnedRing: N equal staging slots in one pinned Buffer, handed out in ring order, each guarded
// by the slot state machine (slot_state.h) and an Event recorded after its consumer.
//
//   FERRY_ASSIGN_OR_RETURN(PinnedRing ring, PinnedRing::create({.slots = 2, .slot_bytes = layer,
//                          .event_device = Device::kCuda}, pinned_budget));
//   FERRY_ASSIGN_OR_RETURN(std::size_t s, ring.acquire());      // kFree -> kLoading
//   fill(ring.data(s));  ring.mark_ready(s);                    // -> kReady
//   ring.begin_use(s);                                          // -> kInUse
//   FERRY_TRY(te.h2d(d_layer, ring.data(s), n, ss.h2d()));
//   FERRY_TRY(ring.end_use(s, ss.h2d()));   // records the slot's event; -> kFree once it completes
//
// Invariants:
//   - a slot is acquired only in kFree, and a kInUse slot becomes kFree only after end_use() was
//     called AND its event has completed (reclaimed lazily by acquire/try_acquire/reclaim);
//   - slots are slot_stride() = slot_bytes rounded up to 4096 apart and 4096-aligned, so a slot is
//     also a valid NVMe store buffer;
//   - illegal transitions (mark_ready on a free slot, double begin_use, ...) abort;
//   - single-threaded: one executor thread drives a ring.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "core/device.h"
#include "core/result.h"
#include "mem/buffer.h"
#include "mem/event.h"
#include "mem/slot_state.h"

namespace ferry::mem {

struct PinnedRingOptions {
  std::size_t slots = 2;
  std::size_t slot_bytes = 0;
  Device event_device = Device::kCpu;  // the device whose streams consume the slots
  int device_index = 0;
  BufferOptions buffer{.write_combined = false, .what = "pinned ring"};
};

class PinnedRing {
 public:
  static Result<PinnedRing> create(const PinnedRingOptions& opts, MemoryBudget& pinned_budget);

  PinnedRing(PinnedRing&&) noexcept = default;
  PinnedRing& operator=(PinnedRing&&) noexcept = default;

  // The next slot in ring order if it is (or can be reclaimed to) kFree; moves it to kLoading.
  Result<std::optional<std::size_t>> try_acquire();
  // Like try_acquire but blocks on the next slot's consumer event. A next slot that is loading,
  // ready, or in use without end_use() returns resource_exhausted (the ring is too small for the
  // caller's pipeline depth).
  Result<std::size_t> acquire();
  void mark_ready(std::size_t slot);  // kLoading -> kReady
  void discard(std::size_t slot);     // kReady -> kFree
  void begin_use(std::size_t slot);   // kReady -> kInUse
  // Records the slot's event on the consumer's stream; the slot becomes kFree once it completes.
  Status end_use(std::size_t slot, Stream& consumer);
  // Moves every kInUse slot whose release event has completed to kFree.
  Status reclaim();

  std::byte* data(std::size_t slot) const;
  SlotState state(std::size_t slot) const;
  std::size_t num_slots() const { return slots_.size(); }
  std::size_t slot_bytes() const { return slot_bytes_; }
  std::size_t slot_stride() const { return slot_stride_; }

 private:
  struct Slot {
    SlotState state = SlotState::kFree;
    bool release_recorded = false;
    Event done;
  };
  PinnedRing() = default;
  Slot& at(std::size_t slot);
  Result<bool> try_reclaim(std::size_t slot);

  Buffer buffer_;
  std::vector<Slot> slots_;
  std::size_t slot_bytes_ = 0;
  std::size_t slot_stride_ = 0;
  std::size_t next_ = 0;
};

}  // namespace ferry::mem
