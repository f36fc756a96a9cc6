// SPDX-License-Identifier: Apache-2.0
#include "serve/slot_resolve.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace ferry::serve {

void resolve_slots_twin(const SlotResolveArgs& a) {
  const SlotStateView st{a.state, a.E, a.max_cap};
  std::int32_t* log = a.log;
  std::int32_t* slot_of = st.slot_of();
  std::int32_t* expert_in = st.expert_in();
  std::uint32_t* stamp = st.stamp();
  std::int32_t* flags = st.flags();
  std::uint32_t* uses = st.uses();
  const int cap = st.cap();
  const int rule = st.rule();
  std::uint32_t* score_at = st.score_at();
  double* score = st.score();
  const int h = st.half_life();
  std::int32_t* ids_out = log + SlotStateLayout::kLogHeader;
  std::int32_t* miss_expert = ids_out + a.E;
  std::int32_t* miss_slot = ids_out + 2 * a.E;
  std::int32_t* evicted = ids_out + 3 * a.E;
  std::int32_t hits = 0, misses = 0, evictions = 0, errors = 0;
  // The previous call's working set goes back to resident (ExpertPager::release).
  for (int s = 0; s < a.max_cap; ++s) flags[s] &= ~kernels::cuda::kSlotInUse;
  const std::uint32_t tick = ++st.tick();
  // Distinct experts in first-appearance order (ExpertExecutor::resolve_group), the ids logged.
  // A resident expert is a hit: marked in use first, so no miss can evict it.
  thread_local std::vector<std::int32_t> distinct;  // grows to E once, then reused
  distinct.resize(std::size_t(a.E));
  std::int64_t nd = 0;
  std::int32_t* seen = evicted;  // scratch [E] until the misses are logged: cleared below
  for (int e = 0; e < a.E; ++e) seen[e] = 0;
  for (std::int64_t i = 0; i < a.n; ++i) {
    const std::int32_t e = a.ids[i];
    if (i < a.E) ids_out[i] = e;
    if (e < 0 || e >= a.E || i >= a.E) {
      ++errors;
      continue;
    }
    if (seen[e]) continue;
    seen[e] = 1;
    distinct[nd++] = e;
  }
  for (std::int64_t d = 0; d < nd; ++d) {
    const std::int32_t s = slot_of[distinct[d]];
    if (s < 0) continue;
    flags[s] |= kernels::cuda::kSlotInUse;
    stamp[s] = tick;
    ++uses[s];
    if (rule == kernels::cuda::kSlotRuleLfru) {  // EvictionRanker::on_hit
      score[s] = std::fma(score[s], lfru_decay(a.lfru_decay, h, tick - score_at[s]), 1.0);
      score_at[s] = tick;
    }
    ++hits;
  }
  for (int e = 0; e < a.E; ++e) evicted[e] = -1;
  // Misses in order: the lowest empty slot under the cap, else among the slots that are neither
  // hot nor in use the least recently stamped (LRU), the fewest uses (LFU) or the smallest score
  // now (LFRU), then the least recently stamped; ties: the lowest slot — ExpertPager::take_slot
  // with EvictionRanker's rule.
  const auto score_now = [&](int s) {
    return score[s] * lfru_decay(a.lfru_decay, h, tick - score_at[s]);
  };
  for (std::int64_t d = 0; d < nd; ++d) {
    const std::int32_t e = distinct[d];
    if (slot_of[e] >= 0) continue;
    int victim = -1;
    for (int s = 0; s < cap && victim < 0; ++s) {
      if (expert_in[s] < 0) victim = s;
    }
    if (victim < 0) {
      for (int s = 0; s < cap; ++s) {
        if (flags[s] & (kernels::cuda::kSlotHot | kernels::cuda::kSlotInUse)) continue;
        if (victim < 0) {
          victim = s;
          continue;
        }
        bool first;
        if (rule == kernels::cuda::kSlotRuleLfu && uses[s] != uses[victim]) {
          first = uses[s] < uses[victim];
        } else if (rule == kernels::cuda::kSlotRuleLfru && score_now(s) != score_now(victim)) {
          first = score_now(s) < score_now(victim);
        } else {
          first = stamp[s] < stamp[victim];
        }
        if (first) victim = s;
      }
    }
    if (victim < 0) {  // more non-hot experts than slots: the caller's bug
      ++errors;
      continue;
    }
    const std::int32_t old = expert_in[victim];
    if (old >= 0) {
      slot_of[old] = -1;
      a.table[old] = a.table[a.E + old] = a.table[2 * a.E + old] = nullptr;
      ++evictions;
    }
    expert_in[victim] = e;
    slot_of[e] = victim;
    stamp[victim] = tick;
    uses[victim] = 1;
    score_at[victim] = tick;  // EvictionRanker::on_load
    score[victim] = 1.0;
    flags[victim] |= kernels::cuda::kSlotInUse;
    unsigned char* block = a.slot_base + std::int64_t(victim) * a.expert_bytes;
    a.table[e] = block;
    a.table[a.E + e] = block + a.up_offset;
    a.table[2 * a.E + e] = block + a.down_offset;
    miss_expert[misses] = e;
    miss_slot[misses] = victim;
    evicted[misses] = old;
    ++misses;
  }
  log[0] = hits;
  log[1] = misses;
  log[2] = evictions;
  log[3] = errors;
  log[4] = static_cast<std::int32_t>(a.n);
}

void set_block_layout(SlotResolveArgs& a, const ExpertStore& store) {
  const std::int64_t part =
      std::int64_t(store.width()) * store.hidden() * std::int64_t(dtype_size(store.dtype()));
  a.expert_bytes = std::int64_t(store.expert_bytes());
  a.up_offset = part;
  a.down_offset = 2 * part;
}

void copy_misses_twin(const MissCopyArgs& a) {
  const SlotLogView log{a.log, a.E};
  for (std::int32_t j = 0; j < log.misses(); ++j) {
    std::memcpy(a.slot_base + std::int64_t(log.miss_slot()[j]) * a.expert_bytes,
                a.src_base + std::int64_t(log.miss_expert()[j]) * a.expert_bytes,
                std::size_t(a.expert_bytes));
  }
}

Status fill_slot_state(const ExpertPager& pager, const ExpertStore& store, int layer, int max_cap,
                       std::int32_t* state, const void** table, unsigned char* slot_base) {
  const int E = store.experts(), M = max_cap;
  if (M < pager.max_capacity(layer)) {
    return invalid_argument("serve: a slot state block of {} slots for layer {} of up to {}", M,
                            layer, pager.max_capacity(layer));
  }
  const SlotStateView st{state, E, M};
  if (pager.tick(layer) >= std::numeric_limits<std::uint32_t>::max()) {
    return out_of_range("serve: layer {} tick {} outgrew the device resolver's 32-bit stamps",
                        layer, pager.tick(layer));
  }
  state[0] = pager.capacity(layer);
  st.tick() = static_cast<std::uint32_t>(pager.tick(layer));
  switch (pager.policy()) {
    case EvictionPolicy::kLru:
      st.rule() = kernels::cuda::kSlotRuleLru;
      break;
    case EvictionPolicy::kLfu:
      st.rule() = kernels::cuda::kSlotRuleLfu;
      break;
    case EvictionPolicy::kLfru:
      st.rule() = kernels::cuda::kSlotRuleLfru;
      break;
  }
  st.half_life() = static_cast<std::int32_t>(pager.ranker().decay_table().size());
  for (int e = 0; e < E; ++e) st.slot_of()[e] = -1;
  for (int e = 0; e < 3 * E; ++e) table[e] = nullptr;
  const std::size_t eb = store.expert_bytes();
  for (int s = 0; s < M; ++s) {
    const int e = s < pager.capacity(layer) ? pager.expert_in(layer, s) : -1;
    st.expert_in()[s] = e;
    st.stamp()[s] = e >= 0 ? static_cast<std::uint32_t>(pager.last_use(layer, s)) : 0u;
    if (e >= 0 && pager.uses(layer, s) >= std::numeric_limits<std::uint32_t>::max()) {
      return out_of_range("serve: layer {} slot {}: {} uses outgrew the device resolver's 32 bits",
                          layer, s, pager.uses(layer, s));
    }
    st.uses()[s] = e >= 0 ? static_cast<std::uint32_t>(pager.uses(layer, s)) : 0u;
    // The score's tick is at most the layer's tick (checked above to fit).
    st.score_at()[s] = e >= 0 ? static_cast<std::uint32_t>(pager.meta(layer, s).score_at) : 0u;
    st.score()[s] = e >= 0 ? pager.meta(layer, s).score : 0.0;
    st.flags()[s] = e >= 0 && pager.is_hot(layer, e) ? kernels::cuda::kSlotHot : 0;
    if (e < 0) continue;
    st.slot_of()[e] = s;
    const ExpertRef r = store.ref_in(slot_base + std::size_t(s) * eb);
    table[e] = r.gate;
    table[E + e] = r.up;
    table[2 * E + e] = r.down;
  }
  return ok_status();
}

}  // namespace ferry::serve
