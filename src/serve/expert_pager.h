// SPDX-License-Identifier: Apache-2.0
// ExpertPager: a per-layer cache of expert slots on the device tier (emulated in CPU builds) in
// front of the ExpertStore's host blocks, under a hard byte budget.
//   - slot pool: one Arena of sum(caps) slots, each one expert block; caps may differ per layer;
//   - acquire(layer, experts): hits are marked in use and never copy; misses take a free slot or
//     evict a resident expert that is neither in use (the current working set) nor hot, chosen by
//     the EvictionRanker; all misses of the call are then copied in one batch (one sync; on the
//     device, one batch on the copy stream ordered by events, see PagerSetup::overlap);
//   - release(layer): the working set goes back to resident (evictable);
//   - a pinned hot set per layer is loaded at create() and never evicted.
// Slot states and the only legal transitions (anything else aborts: a pager bug):
//   empty -> loading -> in-use <-> resident -> empty      (loading -> resident: hot preload)
// Invariants (tests/unit/serve/pager_test.cpp): resident bytes <= budget; a hit never copies; an
// in-use or hot expert is never evicted; an expert occupies at most one slot of its layer.
// Resizing (MV-WSA, docs/serve_wsa.md): with PagerSetup::max_caps the slot arena is laid out for
// the largest caps, and resize() changes the live caps between steps (nothing in use): growing
// adds empty slots; shrinking evicts by the policy down to the new cap, never a hot expert, then
// moves survivors above the cap into empty slots below it (a device-to-device copy). The shared
// budget is charged the live caps' bytes only (shrink first, then grow), so the device budget is
// what MV-WSA divides. Memory: a resizable pager lays its slots out in a mem::VirtualRegion, each
// layer's max_cap slots from a granule boundary (so no two layers share a granule), and commits
// [0, cap) of every layer: what it really holds is the live caps rounded up to a granule per layer
// (held_bytes()), not max_caps (reserved_bytes()); a shrink decommits the granules wholly above
// the new cap after the survivors moved below it. A fixed pager keeps one exact Arena.
// Not thread-safe: the engine's step drives it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/result.h"
#include "mem/arena.h"
#include "mem/budget.h"
#include "mem/event.h"
#include "mem/transfer_engine.h"
#include "mem/virtual_region.h"
#include "serve/budget_charge.h"
#include "serve/eviction_policy.h"
#include "serve/expert_store.h"

namespace ferry::serve {

enum class ExpertSlotState : std::uint8_t { kEmpty, kLoading, kResident, kInUse };
std::string_view to_string(ExpertSlotState s);
bool is_legal_slot_transition(ExpertSlotState from, ExpertSlotState to);

struct SlotEvent {
  int layer = 0, slot = 0, expert = -1;
  ExpertSlotState from = ExpertSlotState::kEmpty, to = ExpertSlotState::kEmpty;
};

struct PagerCounters {
  std::uint64_t hits = 0, misses = 0, evictions = 0;
  std::uint64_t bytes_copied = 0, copy_batches = 0, acquires = 0;
  std::uint64_t resizes = 0, resize_evictions = 0, bytes_moved = 0;  // resize(): d2d moves
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
};

struct PagerSetup {
  std::vector<int> caps;      // [L] slots per layer, 0 for dense layers
  std::vector<int> max_caps;  // [L] or empty (= caps): the most slots resize() may give a layer
  std::size_t granularity_bytes = 0;  // with max_caps: the reservation's granule (0: the tier's)
  EvictionPolicy policy = EvictionPolicy::kLru;
  int lfru_half_life = 8;
  std::vector<std::vector<int>> hot;    // [L] (or empty) pinned hot experts
  std::size_t budget_bytes = 0;         // 0: exactly the pool's size
  mem::MemoryBudget* shared = nullptr;  // the engine's device budget, charged too (may be null)
  // CUDA engine: slots in GPU memory (tier kDevice); misses are copied by `te` (the CUDA transfer
  // engine) on `copy`, after the work already queued on `compute` (the last readers of an evicted
  // slot), and `compute` waits for the copies (events; no host sync). All null: the host engine
  // and synchronous copies on the pool tier of the CPU engine (pool_tier.h).
  mem::TransferEngine* te = nullptr;
  mem::Stream* copy = nullptr;
  mem::Stream* compute = nullptr;
  // Device pager only: overlap the miss copies with compute on the experts already resident.
  // acquire() then does not make `compute` wait for its batch; it records one event after each
  // miss's copy instead, reports which experts were copied (copy_index) and the caller makes each
  // reader of a missed expert wait for that expert's copy with wait_copy() before launching it.
  // release() aborts if a copy of the acquire was never waited for (a reader could race it).
  bool overlap = false;
};

class ExpertPager {
 public:
  static Result<std::unique_ptr<ExpertPager>> create(const ExpertStore& store,
                                                     const PagerSetup& setup);

  int capacity(int layer) const { return layers_[layer].cap; }
  int hot_count(int layer) const { return layers_[layer].hot_count; }
  bool is_hot(int layer, int expert) const;
  bool is_resident(int layer, int expert) const {
    return layers_[layer].slot_of_expert[expert] >= 0;
  }
  // Empty slots under the layer's live cap (a miss can be admitted without evicting).
  int free_slots(int layer) const;
  // Non-hot distinct experts one acquire() of the layer may hold.
  int group_limit(int layer) const { return capacity(layer) - hot_count(layer); }

  // Makes `experts` (distinct, at most group_limit non-hot) resident and in use; refs[i] points
  // at experts[i]'s slot. Misses are copied in one batch (queued before it returns on a device
  // pager). copy_index (empty, or experts.size()): -1 for an expert that was resident (a hit, no
  // copy), else j, its place in the batch's copy order (0, 1, ...: the argument to wait_copy).
  Status acquire(int layer, std::span<const std::int32_t> experts, std::span<ExpertRef> refs,
                 std::span<int> copy_index = {});
  // Overlap mode (PagerSetup::overlap): makes `stream` wait for the j-th copy of the last
  // acquire() (j from its copy_index). Without overlap, acquire() already ordered compute after
  // the whole batch and this only checks j.
  Status wait_copy(int j, mem::Stream& stream);
  bool overlaps_copies() const { return overlap_; }
  // Ends the layer's current use: in-use slots become resident.
  void release(int layer);
  // Sets every layer's live cap ([L], entries of dense layers ignored). Only between steps (no
  // layer in use: a bug otherwise). invalid_argument: a cap outside [hot + 1, max cap];
  // resource_exhausted: the shared budget cannot take the growth (nothing changed then).
  Status resize(std::span<const int> caps);
  int max_capacity(int layer) const { return layers_[layer].max_cap; }
  // The live caps' bytes (what the shared budget is charged).
  std::size_t live_bytes() const;

  const PagerCounters& counters() const { return counters_; }
  std::size_t resident_bytes() const { return occupied_ * store_.expert_bytes(); }
  // Memory really held for the slots: a resizable pager's committed granules (its whole
  // reservation where the region is backed up front: no VMM, mem/virtual_region.h), else the arena.
  std::size_t held_bytes() const;
  // A resizable pool held whole from creation on (no CUDA VMM, or FERRY_VMM=off).
  bool backed_up_front() const { return resizable() && region_.backed_up_front(); }
  // Address space laid out for the slots (a resizable pager's reservation, else the arena).
  std::size_t reserved_bytes() const;
  bool resizable() const { return !region_.empty(); }
  const mem::MemoryBudget& budget() const { return budget_; }
  // The expert in a slot (-1 empty) and its state, for tests and metrics.
  int expert_in(int layer, int slot) const { return layers_[layer].expert_of_slot[slot]; }
  ExpertSlotState state(int layer, int slot) const { return layers_[layer].state[slot]; }
  // The slot's last use in the layer's ticks (its LRU stamp) and the layer's tick (acquire count).
  std::uint64_t last_use(int layer, int slot) const { return layers_[layer].meta[slot].last_use; }
  std::uint64_t tick(int layer) const { return layers_[layer].tick; }
  // The slot's uses since its expert was loaded (LFU's count) and the victim policy.
  std::uint64_t uses(int layer, int slot) const { return layers_[layer].meta[slot].uses; }
  EvictionPolicy policy() const { return ranker_.policy(); }
  // The slot's whole victim state (LFRU's score and its tick too) and the ranker (its LFRU decay
  // table), for the device resolver's state block.
  const SlotMeta& meta(int layer, int slot) const { return layers_[layer].meta[slot]; }
  const EvictionRanker& ranker() const { return ranker_; }
  // Slot 0 of the layer (slot s is expert_bytes() * s further), where the device resolver's
  // table and copies point.
  std::byte* slot_base(int layer) const { return slot_data(layer, 0); }
  // Mirror mode (device-side slot resolution, slot_resolve.h): acquire() decides exactly as
  // always and counts the misses' bytes and batch, but copies nothing — the device already did.
  // The engine replays a device step's routing through it, so the pager stays the device's
  // mirror (counters, observer, metrics).
  void set_mirror(bool on) { mirror_ = on; }
  // Called on every slot transition (tests check legality and invariants from here).
  void set_observer(std::function<void(const SlotEvent&)> fn) { observer_ = std::move(fn); }

 private:
  struct Layer {
    int cap = 0, hot_count = 0, max_cap = 0;
    std::size_t first_byte = 0;          // slot 0's offset from base_
    std::vector<int> expert_of_slot;     // [cap], -1 empty
    std::vector<ExpertSlotState> state;  // [cap]
    std::vector<SlotMeta> meta;          // [cap]
    std::vector<int> slot_of_expert;     // [E], -1 not resident
    std::vector<bool> hot;               // [E]
    std::vector<int> in_use;             // slots of the current working set
    std::uint64_t tick = 0;
  };
  ExpertPager(const ExpertStore& store, const PagerSetup& setup);
  void move(int layer, int slot, ExpertSlotState to);
  std::byte* slot_data(int layer, int slot) const;
  int take_slot(int layer);  // a free slot, evicting if needed; -1 if none can be had
  // defer: overlap mode's per-copy events instead of making compute wait for the batch.
  Status copy_in(int layer, std::span<const int> slots, bool defer);
  int pick_victim(int layer) const;  // a resident, non-hot slot to evict; -1 if none
  Status shrink(int layer, int cap);
  // Resizable pager: backs slots [0, cap) of the layer / gives back the granules wholly above
  // slot `cap` (the caller made sure nothing queued still reads them).
  Status commit_slots(int layer, int cap);
  Status decommit_slots(int layer, int cap);

  const ExpertStore& store_;
  // Device copies (PagerSetup::te/copy/compute): null on the host path.
  mem::TransferEngine* te_ = nullptr;
  mem::Stream* copy_ = nullptr;
  mem::Stream* compute_ = nullptr;
  mem::Event consumed_, ready_;  // compute -> copy (slot reuse), copy -> compute (slot ready)
  Status order_after_compute();  // copy_ waits for what compute_ has queued
  // Overlap mode: copied_[j] is recorded on copy_ after the batch's j-th copy; waited_[j] says
  // whether the caller ordered its readers after it (checked at release()).
  bool overlap_ = false;
  bool mirror_ = false;
  std::vector<mem::Event> copied_;
  std::vector<bool> waited_;
  int batch_size_ = 0;  // copies of the last acquire()
  EvictionRanker ranker_;
  mem::MemoryBudget budget_;
  BudgetCharge shared_charge_;
  mem::Arena arena_;           // a fixed pager's slots
  mem::VirtualRegion region_;  // a resizable pager's slots (PagerSetup::max_caps)
  std::byte* base_ = nullptr;  // the slots' base: arena_'s or region_'s
  std::vector<Layer> layers_;
  std::size_t occupied_ = 0;  // slots not empty
  std::vector<int> missed_;   // acquire()'s miss list, reserved for the largest cap
  PagerCounters counters_;
  std::function<void(const SlotEvent&)> observer_;
};

}  // namespace ferry::serve
