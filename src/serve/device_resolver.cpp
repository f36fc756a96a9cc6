// SPDX-License-Identifier: Apache-2.0
#include "serve/device_resolver.h"

#include <algorithm>
#include <cstring>

#include "mem/stream.h"
#include "serve/device_ops.h"
#include "serve/pool_tier.h"

namespace ferry::serve {

SlotResolver::SlotResolver(const model::DecoderGeometry& geo, ExpertPager& pager,
                           const ExpertStore& store, mem::MemTier tier)
    : geo_(geo), pager_(pager), store_(store), budget_(tier) {}

Result<std::unique_ptr<SlotResolver>> SlotResolver::create(const model::DecoderGeometry& geo,
                                                           ExpertPager& pager,
                                                           const ExpertStore& store,
                                                           mem::MemoryBudget* shared,
                                                           const SlotResolverDevice* dev) {
  std::unique_ptr<SlotResolver> r(new SlotResolver(
      geo, pager, store, dev != nullptr ? mem::MemTier::kDevice : cpu_engine_pool_tier()));
  const int L = geo.layers, E = geo.experts;
  r->on_device_ = dev != nullptr;
  if (dev != nullptr) {
    if (dev->te == nullptr) return invalid_argument("serve: a device slot resolver needs a te");
    r->dev_ = *dev;
  }
  r->moe_index_.assign(std::size_t(L), -1);
  for (int l = 0; l < L; ++l) {
    if (!geo.layer_is_moe[l]) continue;
    r->moe_index_[std::size_t(l)] = r->moe_layers_++;
  }
  // Every layer's block is laid out for E slots, whatever the pager's caps: the state is then the
  // same bytes for any slot count (a budget sized from a probe engine at top-k slots holds the
  // engine at its real caps — the 2-layer bench's budget was short by the difference), and a
  // resize up to E never needs a larger arena. ~16 bytes per expert and layer.
  r->state_ints_ = SlotStateLayout::state_ints(E, E);
  r->log_ints_ = SlotStateLayout::log_ints(E);
  r->stale_.assign(std::size_t(L), true);
  const std::size_t M = std::size_t(std::max(r->moe_layers_, 1));
  const std::size_t state_bytes = M * std::size_t(r->state_ints_) * 4;
  const std::size_t table_bytes = M * 3 * std::size_t(E) * sizeof(void*);
  const std::size_t log_bytes = M * std::size_t(r->log_ints_) * 4;
  mem::ArenaPlan plan;
  r->s_state_ = plan.add("slot states", state_bytes);
  r->s_table_ = plan.add("slot pointer tables", table_bytes);
  r->s_log_ = plan.add("slot resolve logs", log_bytes);
  r->s_mark_ = plan.add("miss copy pacing mark", 8);
  const std::vector<double>& decay = pager.ranker().decay_table();
  const std::size_t decay_bytes = decay.size() * sizeof(double);
  r->s_decay_ = plan.add("lfru decay table", decay_bytes);
  FERRY_TRY(r->budget_.set_limit(plan.allocation_bytes()));
  // NOTE(serve): the CPU twin's arrays stand for device memory but are not charged to the CPU
  // engine's emulated device budget, so the CPU engine's budgets (and the tests that size them
  // exactly) are the same with and without the twin; the CUDA engine charges them.
  if (r->on_device_) {
    FERRY_ASSIGN_OR_RETURN(
        r->charge_, BudgetCharge::take(shared, plan.allocation_bytes(), "device slot resolution"));
  }
  FERRY_ASSIGN_OR_RETURN(r->arena_, mem::make_arena(plan, r->budget_.tier(), r->budget_,
                                                    {.what = "device slot resolution"}));
  r->src_base_.assign(std::size_t(L), nullptr);
  for (int l = 0; l < L; ++l) {
    if (!geo.layer_is_moe[l]) continue;
    const auto* host = reinterpret_cast<const unsigned char*>(store.block(l, 0));
    if (r->on_device_) {
      // The copy kernel reads the pinned store through its mapped device address.
      Result<const void*> mapped = device::mapped_pointer(host);
      if (!mapped.ok()) {
        return unavailable(
            "serve: device slot resolution reads the pinned expert store through its mapped "
            "address: {} (PagerConfig::device_resolve = false, ferry bench serve "
            "--no-device-resolve: the host path)",
            mapped.status().to_string());
      }
      r->src_base_[std::size_t(l)] = static_cast<const unsigned char*>(*mapped);
    } else {
      r->src_base_[std::size_t(l)] = host;
    }
  }
  if (r->on_device_) {
    auto pinned = [&](std::size_t bytes, std::string_view what) {
      return mem::Buffer::allocate(mem::MemTier::kPinnedHost, bytes, r->host_budget_,
                                   {.what = what});
    };
    FERRY_ASSIGN_OR_RETURN(r->h_state_, pinned(state_bytes, "slot states (host)"));
    FERRY_ASSIGN_OR_RETURN(r->h_table_, pinned(table_bytes, "slot pointer tables (host)"));
    FERRY_ASSIGN_OR_RETURN(r->h_log_, pinned(log_bytes, "slot resolve logs (host)"));
    FERRY_ASSIGN_OR_RETURN(r->h_decay_, pinned(decay_bytes, "lfru decay table (host)"));
    std::memcpy(r->h_decay_.data(), decay.data(), decay_bytes);
  } else {
    std::memcpy(r->arena_.data(r->s_decay_), decay.data(), decay_bytes);
  }
  r->distinct_.reserve(std::size_t(E));
  r->refs_.reserve(std::size_t(E));
  r->copy_index_.reserve(std::size_t(E));
  return r;
}

std::int32_t* SlotResolver::state(int layer) const {
  return arena_.as<std::int32_t>(s_state_) + moe_index_[std::size_t(layer)] * state_ints_;
}
const void** SlotResolver::table_mut(int layer) const {
  return arena_.as<const void*>(s_table_) + moe_index_[std::size_t(layer)] * 3 * geo_.experts;
}
const void* const* SlotResolver::table(int layer) const { return table_mut(layer); }
std::int32_t* SlotResolver::log(int layer) const {
  return arena_.as<std::int32_t>(s_log_) + moe_index_[std::size_t(layer)] * log_ints_;
}

bool SlotResolver::fits(int layer, std::int64_t rows, std::int64_t distinct) const {
  return distinct <= pager_.group_limit(layer) && rows <= geo_.experts &&
         pager_.tick(layer) + 1 < 0xffffffffull;
}

SlotResolveArgs SlotResolver::args(int layer, const std::int32_t* ids, std::int64_t n) const {
  SlotResolveArgs a{.ids = ids,
                    .n = n,
                    .E = geo_.experts,
                    .max_cap = SlotStateLayout::max_cap_of(state_ints_, geo_.experts),
                    .state = state(layer),
                    .table = table_mut(layer),
                    .log = log(layer),
                    .lfru_decay = arena_.as<const double>(s_decay_),
                    .slot_base = reinterpret_cast<unsigned char*>(pager_.slot_base(layer))};
  set_block_layout(a, store_);
  return a;
}

Status SlotResolver::fill(int layer, std::int32_t* st, const void** table) const {
  // Every layer's block has the widest layout (the largest max cap): slots above this layer's
  // max cap stay empty.
  const int M = SlotStateLayout::max_cap_of(state_ints_, geo_.experts);
  return fill_slot_state(pager_, store_, layer, M, st, table,
                         reinterpret_cast<unsigned char*>(pager_.slot_base(layer)));
}

Status SlotResolver::run_cpu(int layer, const std::int32_t* ids, std::int64_t n,
                             const std::function<void(int, std::span<const std::int32_t>)>& obs) {
  FERRY_CHECK(!on_device_, "serve: run_cpu on a device slot resolver");
  if (stale_[std::size_t(layer)]) {
    FERRY_TRY(fill(layer, state(layer), table_mut(layer)));
    stale_[std::size_t(layer)] = false;
  }
  const SlotResolveArgs a = args(layer, ids, n);
  resolve_slots_twin(a);
  // The misses go through the host transfer engine (what copy_misses_twin does, plus the CPU
  // engine's copy counters and emulated link pacing, as the host pager's copies), one sync.
  const SlotLogView lg{a.log, geo_.experts};
  mem::TransferEngine& te = mem::host_transfer_engine();
  mem::Stream& host = mem::Stream::host();
  for (std::int32_t j = 0; j < lg.misses(); ++j) {
    FERRY_TRY(
        te.h2d(a.slot_base + std::int64_t(lg.miss_slot()[j]) * a.expert_bytes,
               src_base_[std::size_t(layer)] + std::int64_t(lg.miss_expert()[j]) * a.expert_bytes,
               std::size_t(a.expert_bytes), host));
  }
  if (lg.misses() > 0) FERRY_TRY(host.synchronize());
  return replay_layer(layer, a.log, obs);
}

Status SlotResolver::upload_stale(mem::Stream& stream) {
  FERRY_CHECK(on_device_, "serve: upload_stale on a CPU slot resolver");
  if (!decay_uploaded_) {  // the pinned mirror is never written again
    FERRY_TRY(dev_.te->h2d(arena_.data(s_decay_), h_decay_.data(), h_decay_.size(), stream));
    decay_uploaded_ = true;
  }
  for (int l = 0; l < geo_.layers; ++l) {
    if (!geo_.layer_is_moe[l] || !stale_[std::size_t(l)]) continue;
    const std::int64_t m = moe_index_[std::size_t(l)];
    auto* h_st = reinterpret_cast<std::int32_t*>(h_state_.data()) + m * state_ints_;
    auto** h_tb = reinterpret_cast<const void**>(h_table_.data()) + m * 3 * geo_.experts;
    FERRY_TRY(fill(l, h_st, h_tb));
    // The pinned mirror is not written again before the step's sync (the next upload is a
    // later step's).
    FERRY_TRY(dev_.te->h2d(state(l), h_st, std::size_t(state_ints_) * 4, stream));
    FERRY_TRY(
        dev_.te->h2d(table_mut(l), h_tb, 3 * std::size_t(geo_.experts) * sizeof(void*), stream));
    stale_[std::size_t(l)] = false;
  }
  return ok_status();
}

Status SlotResolver::enqueue(int layer, const std::int32_t* d_ids, std::int64_t n,
                             mem::Stream& stream) {
  FERRY_TRY(enqueue_resolve(layer, d_ids, n, stream));
  return enqueue_copy(layer, stream);
}

Status SlotResolver::enqueue_resolve(int layer, const std::int32_t* d_ids, std::int64_t n,
                                     mem::Stream& stream) {
  FERRY_CHECK(on_device_ && !stale_[std::size_t(layer)],
              "serve: device resolve of layer {} with stale state", layer);
  return device::resolve_slots(args(layer, d_ids, n), stream);
}

Status SlotResolver::enqueue_copy(int layer, mem::Stream& stream) {
  FERRY_CHECK(on_device_ && !stale_[std::size_t(layer)],
              "serve: device miss copy of layer {} with stale state", layer);
  const SlotResolveArgs a = args(layer, nullptr, 0);
  auto* mark = arena_.as<unsigned long long>(s_mark_);
  if (dev_.pace_gbps > 0) FERRY_TRY(device::link_pace_mark(mark, stream));
  FERRY_TRY(device::copy_misses({.slot_base = a.slot_base,
                                 .src_base = src_base_[std::size_t(layer)],
                                 .expert_bytes = a.expert_bytes,
                                 .log = a.log,
                                 .E = geo_.experts,
                                 .blocks = dev_.copy_blocks},
                                stream));
  if (dev_.pace_gbps > 0) {
    // The bytes are known on the device only: the wait reads the log's miss count.
    FERRY_TRY(device::link_pace_wait_misses(mark, a.log, std::uint64_t(a.expert_bytes),
                                            dev_.pace_gbps, stream));
  }
  return ok_status();
}

Status SlotResolver::enqueue_log_readback(mem::Stream& stream) {
  return dev_.te->d2h(h_log_.data(), arena_.data(s_log_),
                      std::size_t(std::max(moe_layers_, 1)) * std::size_t(log_ints_) * 4, stream);
}

Status SlotResolver::replay(const std::function<void(int, std::span<const std::int32_t>)>& obs) {
  last_replay_bytes_ = 0;
  for (int l = 0; l < geo_.layers; ++l) {
    if (!geo_.layer_is_moe[l]) continue;
    const auto* lg = reinterpret_cast<const std::int32_t*>(h_log_.data()) +
                     moe_index_[std::size_t(l)] * log_ints_;
    FERRY_TRY(replay_layer(l, lg, obs));
  }
  return ok_status();
}

Status SlotResolver::replay_layer(
    int layer, const std::int32_t* lg,
    const std::function<void(int, std::span<const std::int32_t>)>& obs) {
  const SlotLogView log{lg, geo_.experts};
  const std::span<const std::int32_t> ids(log.ids(), std::size_t(std::max(log.n(), 0)));
  if (log.errors() != 0) {
    stale_[std::size_t(layer)] = true;  // the device skipped something: rewrite from the pager
    for (std::int32_t e : ids) {
      if (e < 0 || e >= geo_.experts) {
        return invalid_argument("serve: expert id {} outside [0, {})", e, geo_.experts);
      }
    }
    return internal_error("serve: device slot resolution of layer {} reported {} errors", layer,
                          log.errors());
  }
  if (obs) obs(layer, ids);
  distinct_.clear();
  for (std::int32_t e : ids) {
    if (std::find(distinct_.begin(), distinct_.end(), e) == distinct_.end()) distinct_.push_back(e);
  }
  refs_.resize(distinct_.size());
  copy_index_.resize(distinct_.size());
  const PagerCounters before = pager_.counters();
  pager_.set_mirror(true);
  const Status acquired = pager_.acquire(layer, distinct_, refs_, copy_index_);
  pager_.set_mirror(false);
  FERRY_TRY(acquired);
  pager_.release(layer);
  const PagerCounters& after = pager_.counters();
  bool same = after.hits - before.hits == std::uint64_t(log.hits()) &&
              after.misses - before.misses == std::uint64_t(log.misses()) &&
              after.evictions - before.evictions == std::uint64_t(log.evictions());
  const std::size_t eb = store_.expert_bytes();
  for (std::size_t i = 0; same && i < distinct_.size(); ++i) {
    const int j = copy_index_[i];
    if (j < 0) continue;
    same = log.miss_expert()[j] == distinct_[i] &&
           refs_[i].gate == pager_.slot_base(layer) + std::size_t(log.miss_slot()[j]) * eb;
  }
  last_replay_bytes_ += std::uint64_t(log.misses()) * eb;
  if (!same) {
    stale_[std::size_t(layer)] = true;
    return internal_error(
        "serve: device slot resolution of layer {} diverged from the host pager ({} hits, {} "
        "misses, {} evictions on the device)",
        layer, log.hits(), log.misses(), log.evictions());
  }
  return ok_status();
}

}  // namespace ferry::serve
