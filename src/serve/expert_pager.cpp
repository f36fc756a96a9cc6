// SPDX-License-Identifier: Apache-2.0
#include "serve/expert_pager.h"

#include <algorithm>

#include "mem/stream.h"
#include "mem/transfer_engine.h"
#include "serve/pool_tier.h"

namespace ferry::serve {

namespace {
std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
}  // namespace

std::string_view to_string(ExpertSlotState s) {
  switch (s) {
    case ExpertSlotState::kEmpty:
      return "empty";
    case ExpertSlotState::kLoading:
      return "loading";
    case ExpertSlotState::kResident:
      return "resident";
    case ExpertSlotState::kInUse:
      return "in-use";
  }
  return "?";
}

bool is_legal_slot_transition(ExpertSlotState from, ExpertSlotState to) {
  using S = ExpertSlotState;
  switch (from) {
    case S::kEmpty:
      return to == S::kLoading;
    case S::kLoading:
      return to == S::kInUse || to == S::kResident;
    case S::kResident:
      return to == S::kInUse || to == S::kEmpty;
    case S::kInUse:
      return to == S::kResident;
  }
  return false;
}

ExpertPager::ExpertPager(const ExpertStore& store, const PagerSetup& setup)
    : store_(store),
      te_(setup.te),
      copy_(setup.copy),
      compute_(setup.compute),
      overlap_(setup.overlap && setup.te != nullptr),
      ranker_(setup.policy, std::max(1, setup.lfru_half_life)),
      budget_(setup.te != nullptr ? mem::MemTier::kDevice : cpu_engine_pool_tier()) {}

Status ExpertPager::order_after_compute() {
  FERRY_TRY(consumed_.record(*compute_));
  return copy_->wait(consumed_);
}

Result<std::unique_ptr<ExpertPager>> ExpertPager::create(const ExpertStore& store,
                                                         const PagerSetup& setup) {
  const int L = static_cast<int>(setup.caps.size());
  if ((setup.te != nullptr) != (setup.copy != nullptr && setup.compute != nullptr)) {
    return invalid_argument("serve: a device pager needs a transfer engine and both streams");
  }
  std::unique_ptr<ExpertPager> p(new ExpertPager(store, setup));
  if (setup.te != nullptr) {
    FERRY_ASSIGN_OR_RETURN(p->consumed_,
                           mem::Event::create(setup.copy->device(), setup.copy->device_index()));
    FERRY_ASSIGN_OR_RETURN(p->ready_,
                           mem::Event::create(setup.copy->device(), setup.copy->device_index()));
  }
  if (setup.overlap && setup.te == nullptr) {
    return invalid_argument("serve: overlapped miss copies need a device pager (streams)");
  }
  p->layers_.resize(L);
  const bool resizable = !setup.max_caps.empty();
  const int device = setup.copy != nullptr ? setup.copy->device_index() : 0;
  // A resizable pager's layers each start on a granule, so committing one layer's slots never
  // backs (or releasing them never drops) another's.
  std::size_t gran = 1;
  if (resizable) {
    FERRY_ASSIGN_OR_RETURN(gran, mem::VirtualRegion::tier_granularity(p->budget_.tier(), device));
    if (setup.granularity_bytes > 0) gran = setup.granularity_bytes;
  }
  std::int64_t slots = 0;
  std::size_t layout_bytes = 0;
  for (int l = 0; l < L; ++l) {
    Layer& ly = p->layers_[l];
    ly.cap = store.has_layer(l) ? setup.caps[l] : 0;
    if (store.has_layer(l) && (ly.cap <= 0 || ly.cap > store.experts())) {
      return invalid_argument("serve: layer {} asks for {} expert slots, need 1..{}", l, ly.cap,
                              store.experts());
    }
    ly.max_cap = ly.cap;
    if (!setup.max_caps.empty() && store.has_layer(l)) {
      if (static_cast<int>(setup.max_caps.size()) != L || setup.max_caps[l] < ly.cap ||
          setup.max_caps[l] > store.experts()) {
        return invalid_argument("serve: layer {}: max cap {} must lie in [{}, {}]", l,
                                setup.max_caps[l], ly.cap, store.experts());
      }
      ly.max_cap = setup.max_caps[l];
    }
    if (resizable && ly.max_cap > 0) layout_bytes = round_up(layout_bytes, gran);
    ly.first_byte = layout_bytes;
    layout_bytes += std::size_t(ly.max_cap) * store.expert_bytes();
    slots += ly.max_cap;
    ly.expert_of_slot.assign(ly.max_cap, -1);
    ly.state.assign(ly.max_cap, ExpertSlotState::kEmpty);
    ly.meta.assign(ly.max_cap, SlotMeta{});
    ly.slot_of_expert.assign(store.experts(), -1);
    ly.hot.assign(store.experts(), false);
    p->missed_.reserve(std::size_t(std::max<int>(int(p->missed_.capacity()), ly.max_cap)));
  }
  if (p->overlap_) {  // one event per copy of the largest batch (a batch fits the layer's slots)
    int largest = 0;
    for (const Layer& ly : p->layers_) largest = std::max(largest, ly.max_cap);
    for (int j = 0; j < largest; ++j) {
      FERRY_ASSIGN_OR_RETURN(mem::Event ev,
                             mem::Event::create(setup.copy->device(), setup.copy->device_index()));
      p->copied_.push_back(std::move(ev));
    }
    p->waited_.assign(p->copied_.size(), true);
  }
  const std::size_t pool = std::size_t(slots) * store.expert_bytes();
  const std::size_t live = p->live_bytes();
  if (resizable) {
    // The pager's own budget is charged the committed granules (at most the whole layout); the
    // shared one the live caps' exact bytes (what MV-WSA divides).
    const std::size_t reserved = round_up(layout_bytes, gran);
    FERRY_TRY(p->budget_.set_limit(std::max<std::size_t>(reserved, 1)));
    FERRY_ASSIGN_OR_RETURN(p->shared_charge_,
                           BudgetCharge::take(setup.shared, live, "expert slot pool"));
    if (reserved > 0) {
      FERRY_ASSIGN_OR_RETURN(p->region_,
                             mem::VirtualRegion::reserve(p->budget_.tier(), reserved, p->budget_,
                                                         {.device = device,
                                                          .granularity = setup.granularity_bytes,
                                                          .what = "expert slot pool"}));
      p->base_ = p->region_.data();
      for (int l = 0; l < L; ++l) FERRY_TRY(p->commit_slots(l, p->layers_[l].cap));
    }
  } else {
    const std::size_t limit = setup.budget_bytes > 0 ? setup.budget_bytes : pool;
    FERRY_TRY(p->budget_.set_limit(limit));
    if (pool > limit) {
      return resource_exhausted("serve: {} expert slots of {} need {}, the expert budget is {}",
                                slots, mem::format_bytes(store.expert_bytes()),
                                mem::format_bytes(pool), mem::format_bytes(limit));
    }
    mem::ArenaPlan plan;
    const mem::SlotId id = plan.add("expert slots", pool);
    FERRY_ASSIGN_OR_RETURN(
        p->shared_charge_,
        BudgetCharge::take(setup.shared, plan.allocation_bytes(), "expert slot pool"));
    FERRY_ASSIGN_OR_RETURN(p->arena_, mem::make_arena(plan, p->budget_.tier(), p->budget_,
                                                      {.what = "expert slot pool"}));
    p->base_ = pool > 0 ? p->arena_.data(id) : nullptr;
  }
  // Pinned hot set: loaded now, never evicted.
  for (int l = 0; l < L && l < static_cast<int>(setup.hot.size()); ++l) {
    Layer& ly = p->layers_[l];
    if (setup.hot[l].empty()) continue;
    if (!store.has_layer(l))
      return invalid_argument("serve: hot experts given for dense layer {}", l);
    std::vector<int> slots_loaded;
    for (int e : setup.hot[l]) {
      if (e < 0 || e >= store.experts() || ly.hot[e]) {
        return invalid_argument("serve: hot expert {} of layer {} is out of range or repeated", e,
                                l);
      }
      if (ly.hot_count + 1 > ly.cap) {
        return invalid_argument("serve: layer {}: {} hot experts do not fit {} slots", l,
                                setup.hot[l].size(), ly.cap);
      }
      ly.hot[e] = true;
      const int s = ly.hot_count++;
      p->move(l, s, ExpertSlotState::kLoading);
      ly.expert_of_slot[s] = e;
      ly.slot_of_expert[e] = s;
      ++p->occupied_;
      slots_loaded.push_back(s);
    }
    FERRY_TRY(p->copy_in(l, slots_loaded, /*defer=*/false));  // compute waits: nobody else will
    for (int s : slots_loaded) {
      p->ranker_.on_load(ly.meta[s], 0);
      p->move(l, s, ExpertSlotState::kResident);
    }
  }
  return p;
}

bool ExpertPager::is_hot(int layer, int expert) const {
  const Layer& ly = layers_[layer];
  return !ly.hot.empty() && ly.hot[expert];
}

void ExpertPager::move(int layer, int slot, ExpertSlotState to) {
  ExpertSlotState& s = layers_[layer].state[slot];
  FERRY_CHECK(is_legal_slot_transition(s, to),
              "serve: illegal expert slot transition {} -> {} "
              "(layer {} slot {})",
              to_string(s), to_string(to), layer, slot);
  const SlotEvent ev{layer, slot, layers_[layer].expert_of_slot[slot], s, to};
  s = to;
  if (observer_) observer_(ev);
}

std::byte* ExpertPager::slot_data(int layer, int slot) const {
  return base_ + layers_[layer].first_byte + std::size_t(slot) * store_.expert_bytes();
}

std::size_t ExpertPager::held_bytes() const {
  return resizable() ? region_.held_bytes() : arena_.buffer().size();
}

std::size_t ExpertPager::reserved_bytes() const {
  return resizable() ? region_.size() : arena_.buffer().size();
}

Status ExpertPager::commit_slots(int layer, int cap) {
  const Layer& ly = layers_[layer];
  if (ly.max_cap == 0) return ok_status();
  return region_.commit(ly.first_byte, std::size_t(cap) * store_.expert_bytes());
}

Status ExpertPager::decommit_slots(int layer, int cap) {
  const Layer& ly = layers_[layer];
  if (ly.max_cap == 0) return ok_status();
  // To the end of the layer's last granule: the next layer starts on a fresh one.
  const std::size_t from = ly.first_byte + std::size_t(cap) * store_.expert_bytes();
  const std::size_t end = std::min(
      region_.size(), round_up(ly.first_byte + std::size_t(ly.max_cap) * store_.expert_bytes(),
                               region_.granularity()));
  return region_.decommit(from, end - from);
}

int ExpertPager::pick_victim(int layer) const {
  const Layer& ly = layers_[layer];
  int victim = -1;
  for (int s = 0; s < ly.cap; ++s) {
    // Only resident, non-hot experts may go: in-use ones are the current working set and
    // loading ones are this call's misses.
    if (ly.state[s] != ExpertSlotState::kResident || ly.hot[ly.expert_of_slot[s]]) continue;
    if (victim < 0 || ranker_.evict_first(ly.meta[s], s, ly.meta[victim], victim, ly.tick)) {
      victim = s;
    }
  }
  return victim;
}

int ExpertPager::free_slots(int layer) const {
  const Layer& ly = layers_[layer];
  int n = 0;
  for (int s = 0; s < ly.cap; ++s) n += ly.state[s] == ExpertSlotState::kEmpty;
  return n;
}

int ExpertPager::take_slot(int layer) {
  Layer& ly = layers_[layer];
  for (int s = 0; s < ly.cap; ++s) {
    if (ly.state[s] == ExpertSlotState::kEmpty) return s;
  }
  const int victim = pick_victim(layer);
  if (victim < 0) return -1;
  ly.slot_of_expert[ly.expert_of_slot[victim]] = -1;
  move(layer, victim, ExpertSlotState::kEmpty);
  ly.expert_of_slot[victim] = -1;
  --occupied_;
  ++counters_.evictions;
  return victim;
}

Status ExpertPager::copy_in(int layer, std::span<const int> slots, bool defer) {
  if (slots.empty()) return ok_status();
  FERRY_CHECK(!defer || slots.size() <= copied_.size(), "serve: {} copies, {} events", slots.size(),
              copied_.size());
  Layer& ly = layers_[layer];
  if (mirror_) {  // the device copied these (slot_resolve.h): count them, copy nothing
    counters_.bytes_copied += slots.size() * store_.expert_bytes();
    ++counters_.copy_batches;
    return ok_status();
  }
  mem::TransferEngine& te = te_ != nullptr ? *te_ : mem::host_transfer_engine();
  mem::Stream& stream = copy_ != nullptr ? *copy_ : mem::Stream::host();
  // Device: an evicted slot may still be read by expert FFNs queued on compute.
  if (te_ != nullptr) FERRY_TRY(order_after_compute());
  for (std::size_t j = 0; j < slots.size(); ++j) {
    const int s = slots[j];
    FERRY_TRY(te.h2d(slot_data(layer, s), store_.block(layer, ly.expert_of_slot[s]),
                     store_.expert_bytes(), stream));
    counters_.bytes_copied += store_.expert_bytes();
    if (defer) {  // this expert's readers may start as soon as its own copy lands
      FERRY_TRY(copied_[j].record(stream));
      waited_[j] = false;
    }
  }
  if (defer) {
    batch_size_ = static_cast<int>(slots.size());
  } else if (te_ != nullptr) {
    // The batch is queued; compute waits for it on the device, the host goes on.
    FERRY_TRY(ready_.record(stream));
    FERRY_TRY(compute_->wait(ready_));
  } else {
    FERRY_TRY(stream.synchronize());  // one sync for the whole batch
  }
  ++counters_.copy_batches;
  return ok_status();
}

Status ExpertPager::acquire(int layer, std::span<const std::int32_t> experts,
                            std::span<ExpertRef> refs, std::span<int> copy_index) {
  Layer& ly = layers_[layer];
  FERRY_CHECK(ly.in_use.empty(), "serve: pager layer {} acquired twice without release", layer);
  FERRY_CHECK(refs.size() == experts.size(), "serve: pager refs/experts size mismatch");
  FERRY_CHECK(copy_index.empty() || copy_index.size() == experts.size(),
              "serve: pager copy_index/experts size mismatch");
  // An empty group (every miss of the call computed on the host: miss placement) has no copies.
  FERRY_CHECK(!overlap_ || mirror_ || experts.empty() || !copy_index.empty(),
              "serve: an overlapping pager's caller must take copy_index (and wait_copy)");
  int non_hot = 0;
  for (std::int32_t e : experts) {
    if (e < 0 || e >= store_.experts()) {
      return invalid_argument("serve: expert id {} outside [0, {})", e, store_.experts());
    }
    non_hot += !ly.hot[e];
  }
  if (non_hot > group_limit(layer)) {
    return invalid_argument("serve: layer {}: {} experts in one group exceed the {} free slots",
                            layer, non_hot, group_limit(layer));
  }
  ++ly.tick;
  ++counters_.acquires;
  std::vector<int>& missed = missed_;  // reserved to the largest cap at create(): no allocation
  missed.clear();
  // Hits first, so no later miss can evict them.
  for (std::int32_t e : experts) {
    const int s = ly.slot_of_expert[e];
    if (s < 0) continue;
    FERRY_CHECK(ly.state[s] == ExpertSlotState::kResident,
                "serve: expert {} listed twice in one acquire (layer {})", e, layer);
    move(layer, s, ExpertSlotState::kInUse);
    ranker_.on_hit(ly.meta[s], ly.tick);
    ly.in_use.push_back(s);
    ++counters_.hits;
  }
  for (std::int32_t e : experts) {
    if (ly.slot_of_expert[e] >= 0) continue;
    const int s = take_slot(layer);
    FERRY_CHECK(s >= 0, "serve: no evictable slot in layer {} (group limit not enforced)", layer);
    ly.expert_of_slot[s] = e;
    ly.slot_of_expert[e] = s;
    move(layer, s, ExpertSlotState::kLoading);
    ++occupied_;
    missed.push_back(s);
    ++counters_.misses;
  }
  batch_size_ = 0;
  FERRY_TRY(copy_in(layer, missed, overlap_));
  for (int s : missed) {
    ranker_.on_load(ly.meta[s], ly.tick);
    move(layer, s, ExpertSlotState::kInUse);
    ly.in_use.push_back(s);
  }
  for (std::size_t i = 0; i < experts.size(); ++i) {
    refs[i] = store_.ref_in(slot_data(layer, ly.slot_of_expert[experts[i]]));
  }
  if (!copy_index.empty()) {
    // missed[j] is the slot of the j-th copy; a hit's slot is not in it.
    for (std::size_t i = 0; i < experts.size(); ++i) {
      const int s = ly.slot_of_expert[experts[i]];
      const auto it = std::find(missed.begin(), missed.end(), s);
      copy_index[i] = it == missed.end() ? -1 : static_cast<int>(it - missed.begin());
    }
  }
  if (!overlap_) batch_size_ = static_cast<int>(missed.size());
  return ok_status();
}

Status ExpertPager::wait_copy(int j, mem::Stream& stream) {
  FERRY_CHECK(j >= 0 && j < batch_size_, "serve: wait_copy({}) of a batch of {} copies", j,
              batch_size_);
  if (!overlap_) return ok_status();  // acquire() made compute wait for the whole batch
  FERRY_TRY(stream.wait(copied_[std::size_t(j)]));
  waited_[std::size_t(j)] = true;
  return ok_status();
}

std::size_t ExpertPager::live_bytes() const {
  std::size_t slots = 0;
  for (const Layer& ly : layers_) slots += std::size_t(ly.cap);
  return slots * store_.expert_bytes();
}

Status ExpertPager::shrink(int layer, int cap) {
  Layer& ly = layers_[layer];
  int occupied = 0;
  for (int s = 0; s < ly.cap; ++s) occupied += ly.state[s] != ExpertSlotState::kEmpty;
  // Evict by the policy until the survivors fit the new cap (resize checked cap > hot count).
  while (occupied > cap) {
    const int v = pick_victim(layer);
    FERRY_CHECK(v >= 0, "serve: layer {} has no evictable expert while shrinking", layer);
    ly.slot_of_expert[ly.expert_of_slot[v]] = -1;
    move(layer, v, ExpertSlotState::kEmpty);
    ly.expert_of_slot[v] = -1;
    --occupied_;
    --occupied;
    ++counters_.resize_evictions;
  }
  // Survivors above the cap move down into empty slots (device-to-device, one sync).
  mem::TransferEngine& te = te_ != nullptr ? *te_ : mem::host_transfer_engine();
  mem::Stream& stream = copy_ != nullptr ? *copy_ : mem::Stream::host();
  if (te_ != nullptr) FERRY_TRY(order_after_compute());
  int low = 0;
  bool copied = false;
  for (int s = cap; s < ly.cap; ++s) {
    if (ly.state[s] == ExpertSlotState::kEmpty) continue;
    while (ly.state[low] != ExpertSlotState::kEmpty) ++low;  // exists: occupied <= cap
    const int e = ly.expert_of_slot[s];
    ly.expert_of_slot[low] = e;
    move(layer, low, ExpertSlotState::kLoading);
    FERRY_TRY(te.d2d(slot_data(layer, low), slot_data(layer, s), store_.expert_bytes(), stream));
    copied = true;
    counters_.bytes_moved += store_.expert_bytes();
    ly.meta[low] = ly.meta[s];
    ly.slot_of_expert[e] = low;
    move(layer, s, ExpertSlotState::kEmpty);
    ly.expert_of_slot[s] = -1;
  }
  if (copied) FERRY_TRY(stream.synchronize());
  for (int s = 0; s < cap; ++s) {
    if (ly.state[s] == ExpertSlotState::kLoading) move(layer, s, ExpertSlotState::kResident);
  }
  ly.cap = cap;
  return ok_status();
}

Status ExpertPager::resize(std::span<const int> caps) {
  const int L = static_cast<int>(layers_.size());
  if (static_cast<int>(caps.size()) != L) {
    return invalid_argument("serve: pager resize got {} caps for {} layers", caps.size(), L);
  }
  std::size_t slots = 0;
  for (int l = 0; l < L; ++l) {
    const Layer& ly = layers_[l];
    FERRY_CHECK(ly.in_use.empty(), "serve: pager resize while layer {} is in use", l);
    if (ly.max_cap == 0) continue;
    if (caps[l] <= ly.hot_count || caps[l] > ly.max_cap) {
      return invalid_argument("serve: layer {}: cap {} outside [{}, {}] (hot experts + 1, max cap)",
                              l, caps[l], ly.hot_count + 1, ly.max_cap);
    }
    slots += std::size_t(caps[l]);
  }
  const std::size_t now = live_bytes(), next = slots * store_.expert_bytes();
  if (next > now && next - now > shared_charge_.budget_free()) {
    return resource_exhausted("serve: pager resize needs {} more, the device budget has {} free",
                              mem::format_bytes(next - now),
                              mem::format_bytes(shared_charge_.budget_free()));
  }
  // Shrink first so the shared budget never holds both the old and the new bytes.
  bool shrunk = false;
  for (int l = 0; l < L; ++l) {
    if (layers_[l].max_cap > 0 && caps[l] < layers_[l].cap) {
      FERRY_TRY(shrink(l, caps[l]));
      shrunk = true;
    }
  }
  if (shrunk && resizable()) {
    // The granules above the new caps go back. Nothing queued may still read them: the expert
    // FFNs of the last step (compute) and the moves / copies (copy) are waited for first.
    if (te_ != nullptr) {
      FERRY_TRY(compute_->synchronize());
      FERRY_TRY(copy_->synchronize());
    }
    for (int l = 0; l < L; ++l) FERRY_TRY(decommit_slots(l, layers_[l].cap));
  }
  if (next < now) FERRY_TRY(shared_charge_.resize(next, "expert slot pool"));
  if (resizable()) {
    // Growth is backed before it is charged or used; a refused commit (out of device memory)
    // gives back what this call committed and leaves the (already shrunk) caps.
    for (int l = 0; l < L; ++l) {
      if (layers_[l].max_cap == 0 || caps[l] <= layers_[l].cap) continue;
      if (Status st = commit_slots(l, caps[l]); !st.ok()) {
        for (int u = 0; u <= l; ++u) FERRY_CHECK_OK(decommit_slots(u, layers_[u].cap));
        FERRY_CHECK_OK(shared_charge_.resize(live_bytes(), "expert slot pool"));
        return st;
      }
    }
  }
  if (next > now) FERRY_TRY(shared_charge_.resize(next, "expert slot pool"));
  for (int l = 0; l < L; ++l) {
    if (layers_[l].max_cap > 0 && caps[l] > layers_[l].cap) layers_[l].cap = caps[l];
  }
  ++counters_.resizes;
  return ok_status();
}

void ExpertPager::release(int layer) {
  Layer& ly = layers_[layer];
  for (int j = 0; j < batch_size_ && overlap_; ++j) {
    FERRY_CHECK(waited_[std::size_t(j)],
                "serve: layer {} released with copy {} of its batch never waited for", layer, j);
  }
  batch_size_ = 0;
  for (int s : ly.in_use) move(layer, s, ExpertSlotState::kResident);
  ly.in_use.clear();
}

}  // namespace ferry::serve
