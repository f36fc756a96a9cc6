// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/live_split.h"

#include <algorithm>

#include "core/check.h"
#include "core/dtype.h"
#include "core/timer.h"

namespace ferry::serve::wsa {

Result<InitialSplit> initial_split(const model::DecoderGeometry& geo, std::size_t expert_bytes,
                                   std::size_t kv_block_bytes, std::size_t budget_bytes,
                                   int kv_floor_blocks, double expert_fraction) {
  int moe = 0;
  for (bool m : geo.layer_is_moe) moe += m;
  if (moe == 0) return invalid_argument("wsa: the model has no MoE layer to split against");
  const std::size_t floor_bytes = std::size_t(kv_floor_blocks) * kv_block_bytes;
  int cap = static_cast<int>(double(budget_bytes) * expert_fraction /
                             (double(expert_bytes) * double(moe)));
  cap = std::clamp(cap, geo.top_k, geo.experts);
  while (cap > geo.top_k && std::size_t(cap) * moe * expert_bytes + floor_bytes > budget_bytes) {
    --cap;
  }
  const std::size_t experts = std::size_t(cap) * std::size_t(moe) * expert_bytes;
  if (experts + std::max(floor_bytes, kv_block_bytes) > budget_bytes) {
    return resource_exhausted(
        "wsa: budget {} cannot hold top-k = {} slots in {} layers ({}) and the kv floor ({})",
        mem::format_bytes(budget_bytes), geo.top_k, moe, mem::format_bytes(experts),
        mem::format_bytes(floor_bytes));
  }
  InitialSplit s;
  for (bool m : geo.layer_is_moe) s.caps.push_back(m ? cap : 0);
  s.kv_bytes = (budget_bytes - experts) / kv_block_bytes * kv_block_bytes;
  return s;
}

namespace {

// The engine's layouts (expert_store.h: experts in PagerConfig::expert_dtype, f32 or bf16;
// kv_cache.h: rows in KvConfig::dtype).
std::size_t engine_expert_bytes(const model::DecoderGeometry& geo, const EngineConfig& ec) {
  return 3 * std::size_t(geo.hidden) * std::size_t(geo.expert_width) *
         dtype_size(ec.pager.expert_dtype);
}

void configure_from(const InitialSplit& init, std::size_t budget_bytes, EngineConfig& ec) {
  ec.pager.mode = ExpertMode::kPaged;
  ec.pager.resizable = true;
  ec.pager.layer_slots = init.caps;
  ec.pager.slots_per_layer = 0;
  ec.pager.budget_bytes = 0;
  ec.kv.budget_bytes = init.kv_bytes;
  ec.kv.max_budget_bytes = budget_bytes;
  ec.kv_preempt = true;
  ec.device_budget_bytes = budget_bytes;
}

}  // namespace

Status configure_auto_split(const model::DecoderGeometry& geo, std::size_t budget_bytes,
                            int kv_floor_blocks, EngineConfig& ec) {
  const std::size_t kb = kv_block_bytes(geo, ec.kv.block_tokens, ec.kv.dtype);
  FERRY_ASSIGN_OR_RETURN(InitialSplit init, initial_split(geo, engine_expert_bytes(geo, ec), kb,
                                                          budget_bytes, kv_floor_blocks));
  configure_from(init, budget_bytes, ec);
  return ok_status();
}

Status configure_auto_split(const model::DecoderGeometry& geo, std::size_t budget_bytes,
                            int kv_floor_blocks, const Split& start, EngineConfig& ec) {
  const std::size_t eb = engine_expert_bytes(geo, ec);
  const std::size_t kb = kv_block_bytes(geo, ec.kv.block_tokens, ec.kv.dtype);
  const auto moe = std::count(geo.layer_is_moe.begin(), geo.layer_is_moe.end(), true);
  if (std::size_t(moe) != start.slots.size()) {
    return invalid_argument("wsa: start split has {} slot counts, the model {} MoE layers",
                            start.slots.size(), moe);
  }
  InitialSplit init;
  std::size_t expert_total = 0, next = 0;
  for (bool is_moe : geo.layer_is_moe) {
    const int c = is_moe ? start.slots[next++] : 0;
    if (is_moe && (c < geo.top_k || c > geo.experts)) {
      return invalid_argument("wsa: start split: {} slots in MoE layer {} outside [top-k {}, {}]",
                              c, next - 1, geo.top_k, geo.experts);
    }
    init.caps.push_back(c);
    expert_total += std::size_t(c) * eb;
  }
  if (start.kv_blocks < std::max(kv_floor_blocks, 1)) {
    return invalid_argument("wsa: start split has {} kv blocks, below the floor of {}",
                            start.kv_blocks, std::max(kv_floor_blocks, 1));
  }
  init.kv_bytes = std::size_t(start.kv_blocks) * kb;
  if (expert_total + init.kv_bytes > budget_bytes) {
    return invalid_argument(
        "wsa: start split needs {} ({} of expert slots + {} blocks of {}), the budget is {} (a "
        "plan for another budget, expert dtype or kv dtype?)",
        mem::format_bytes(expert_total + init.kv_bytes), mem::format_bytes(expert_total),
        start.kv_blocks, mem::format_bytes(kb), mem::format_bytes(budget_bytes));
  }
  configure_from(init, budget_bytes, ec);
  return ok_status();
}

LiveSplitConfig priced_by(LiveSplitConfig cfg, const StepModel& m, std::size_t expert_bytes) {
  cfg.step_base_s = m.step_s;
  cfg.prefill_token_s = m.token_s;
  cfg.link_bytes_per_s = m.miss_s > 0 ? double(expert_bytes) / m.miss_s : 0.0;
  return cfg;
}

int decode_floor_slots(int experts, int top_k, int max_running, int hot) {
  return static_cast<int>(std::min<std::int64_t>(
      experts, std::int64_t(std::max(max_running, 1)) * top_k + std::max(hot, 0)));
}

Result<std::unique_ptr<LiveSplit>> LiveSplit::attach(Engine& eng, const LiveSplitConfig& cfg) {
  ExpertPager* pager = eng.experts().pager();
  if (pager == nullptr) return invalid_argument("wsa: --split auto needs the paged expert mode");
  const model::DecoderGeometry& geo = eng.geometry();
  std::unique_ptr<LiveSplit> ls(new LiveSplit(eng, cfg));
  if (ls->cfg_.controller.link_bytes_per_s <= 0) {
    ls->cfg_.controller.link_bytes_per_s = cfg.link_bytes_per_s;
  }
  ls->ctl_ = SplitController(ls->cfg_.controller);
  // A recomputed prefix block is priced by full prefill chunks (demand.h PrefillCost).
  ls->prefill_cost_ = PrefillCost(double(eng.config().max_batch_tokens));
  ls->prefill_base_cost_ = PrefillCost(double(eng.config().max_batch_tokens));
  ls->cadence_ =
      DecisionCadence({.min_steps = cfg.min_decide_steps,
                       .max_steps = cfg.decide_every_steps,
                       .accesses_per_decision = cfg.decide_accesses_per_expert * geo.experts,
                       .age_per_64_steps = cfg.age_factor});
  const int L = static_cast<int>(geo.layer_is_moe.size());
  ls->layer_index_.assign(std::size_t(L), -1);
  int max_hot = 0;
  for (int l = 0; l < L; ++l) {
    if (!geo.layer_is_moe[std::size_t(l)]) continue;
    if (pager->max_capacity(l) < geo.experts) {
      return invalid_argument("wsa: the pager is not resizable (PagerConfig::resizable)");
    }
    ls->layer_index_[std::size_t(l)] = static_cast<int>(ls->moe_layers_.size());
    ls->moe_layers_.push_back(l);
    ls->sd_.emplace_back(geo.experts);
    ls->current_.slots.push_back(pager->capacity(l));
    max_hot = std::max(max_hot, pager->hot_count(l));
  }
  ls->chunks_ = ChunkMisses(static_cast<int>(ls->sd_.size()), geo.experts,
                            double(eng.config().max_batch_tokens));
  KvCache& kv = eng.kv();
  if ((std::size_t(kv.capacity_blocks()) + 1) * kv.block_bytes() <= cfg.budget_bytes) {
    return invalid_argument(
        "wsa: the kv pool is not resizable up to the budget (max_budget_bytes)");
  }
  ls->current_.kv_blocks = kv.num_blocks();
  int ctx = cfg.max_context_tokens;
  if (ctx <= 0 && eng.config().max_seq_len > 0 && eng.config().max_seq_len < (1 << 30)) {
    ctx = eng.config().max_seq_len;
  }
  CostModel& m = ls->model_;
  m.budget_bytes = cfg.budget_bytes;
  m.expert_bytes = eng.experts().store()->expert_bytes();
  m.kv_block_bytes = kv.block_bytes();
  m.min_slots = geo.top_k + max_hot;
  m.kv_floor_blocks = ctx > 0 ? cfg.concurrency * kv.blocks_for(ctx) : 0;
  if (cfg.decode_on_device) {
    // Never above the largest uniform cap that fits next to the KV floor: a budget too small for
    // the decode floor keeps the plain one's choices (decode steps then take the host path when
    // they route more experts than a layer holds) instead of a problem no split solves.
    const std::size_t floor_bytes = std::size_t(m.kv_floor_blocks) * m.kv_block_bytes;
    const std::size_t per_cap = ls->sd_.size() * m.expert_bytes;
    const int fits = floor_bytes < cfg.budget_bytes && per_cap > 0
                         ? static_cast<int>((cfg.budget_bytes - floor_bytes) / per_cap)
                         : 0;
    m.min_slots = std::max(m.min_slots,
                           std::min(fits, decode_floor_slots(geo.experts, geo.top_k,
                                                             eng.config().max_running, max_hot)));
  }
  m.kv_max_blocks = static_cast<int>(cfg.budget_bytes / m.kv_block_bytes);
  m.link_bytes_per_s = cfg.link_bytes_per_s;
  m.kv_block_cost_s = double(kv.block_tokens()) * cfg.prefill_token_s;
  LiveSplit* self = ls.get();
  if (kv.prefix_cache()) {
    ls->prefix_ = std::make_unique<PrefixStackDistance>(m.kv_max_blocks);
    kv.set_prefix_observer([self](bool lookup, std::span<const std::uint64_t> keys, int pinned) {
      if (lookup) {
        self->prefix_->lookup(keys, pinned);
      } else {
        for (std::uint64_t k : keys) self->prefix_->touch(k);
      }
    });
  }
  // One access per distinct expert of each layer call (a step's batch), as one set: the pager
  // acquires a step's experts as a set, residents first (StackDistance::access_set), and the
  // split simulator counts the same way.
  eng.experts().set_access_observer([self](int layer, std::span<const std::int32_t> ids) {
    const int i = self->layer_index_[std::size_t(layer)];
    if (i < 0) return;
    std::vector<std::uint8_t>& seen = self->seen_;
    seen.assign(std::size_t(self->sd_[std::size_t(i)].items()), 0);
    self->distinct_.clear();
    for (std::int32_t e : ids) {
      if (seen[std::size_t(e)]) continue;
      seen[std::size_t(e)] = 1;
      self->distinct_.push_back(e);
    }
    self->sd_[std::size_t(i)].access_set(self->distinct_, self->order_);
    self->chunks_.add_layer(i, self->order_);
    self->step_accesses_ += double(self->distinct_.size());
  });
  eng.set_step_hook([self](Engine& e) { return self->on_step(e); });
  return ls;
}

LiveSplit::~LiveSplit() {
  eng_.experts().set_access_observer(nullptr);
  eng_.kv().set_prefix_observer(nullptr);
  eng_.set_step_hook(nullptr);
}

SplitProblem LiveSplit::problem(const Engine& eng) const { return problem(eng, false); }

SplitProblem LiveSplit::decision_problem(const Engine& eng) const {
  return problem(eng, cfg_.reuse_prior);
}

SplitProblem LiveSplit::problem(const Engine& eng, bool reuse_prior) const {
  CostModel m = model_;
  // Never below what is in use or what an outstanding request needs (KvCache / Engine refuse).
  m.kv_floor_blocks = std::max({m.kv_floor_blocks, eng.kv_demand().used, eng.max_request_blocks()});
  m.kv_max_blocks = std::max(m.kv_max_blocks, m.kv_floor_blocks);
  m.prefix_block_cost_s =
      double(eng_.kv().block_tokens()) * prefill_cost_.per_token_s(cfg_.prefill_token_s);
  m.prefix_reuse_prior = reuse_prior;
  // One build serves both: `seen` is the prefix curve without the reuse prior, bit for bit what
  // problem(eng, false) holds (make_problem), so the decision problem no longer builds a second
  // whole problem (expert curves, KV shortage curve) for the one entry it needs.
  std::vector<double> seen;
  SplitProblem p = make_problem(m, sd_, steps_, kv_.samples(), prefix_.get(),
                                reuse_prior ? eng.final_blocks() : 0, &seen);
  // The cap-dependent price (allocate_priced_by_caps; the live controller with price_by_caps),
  // and the blocks this run recomputed per step: the observed curve at the pool's size now (a
  // fixed split's profile held that size throughout).
  if (!p.kv_prefix_misses.empty()) {
    p.recompute_misses = chunks_.per_block(eng_.kv().block_tokens());
    if (!p.recompute_misses.empty()) {
      p.prefix_block_base_s =
          double(eng_.kv().block_tokens()) * prefill_base_cost_.per_token_s(cfg_.prefill_token_s);
      p.prefix_misses_seen =
          seen[std::size_t(std::min<int>(current_.kv_blocks, static_cast<int>(seen.size()) - 1))];
    }
  }
  return p;
}

void LiveSplit::observe_step_cost(const Engine& eng) {
  const EngineStats& st = eng.stats();
  const ExpertPager* pager = eng_.experts().pager();
  const std::uint64_t misses = pager != nullptr ? pager->counters().misses : 0;
  const double dm = double(misses - last_misses_);
  const double dp = double(st.prefill_tokens - last_prefill_);
  const double dd = double(st.decode_tokens - last_decode_);
  last_misses_ = misses;
  last_prefill_ = st.prefill_tokens;
  last_decode_ = st.decode_tokens;
  const double miss_s =
      cfg_.link_bytes_per_s > 0 ? double(model_.expert_bytes) / cfg_.link_bytes_per_s : 0.0;
  const double base_s = cfg_.step_base_s + cfg_.prefill_token_s * (dp + dd);
  prefill_cost_.add(base_s + dm * miss_s, dp + dd, dp);
  prefill_base_cost_.add(base_s, dp + dd, dp);
  chunks_.end_step(dp + dd, dp);
}

Status LiveSplit::apply(Engine& eng, const Split& s) {
  std::vector<int> caps(layer_index_.size(), 0);
  for (std::size_t i = 0; i < moe_layers_.size(); ++i)
    caps[std::size_t(moe_layers_[i])] = s.slots[i];
  FERRY_TRY(eng.resize_pools(caps, s.kv_blocks));
  current_ = s;
  // The iso-budget invariant, on what the pools really hold now.
  std::size_t bytes = std::size_t(eng.kv().num_blocks()) * eng.kv().block_bytes();
  for (int l : moe_layers_) {
    bytes += std::size_t(eng.experts().pager()->capacity(l)) * model_.expert_bytes;
  }
  FERRY_CHECK(bytes <= cfg_.budget_bytes, "wsa: split holds {} bytes, budget {}", bytes,
              cfg_.budget_bytes);
  FERRY_CHECK(eng.kv().num_blocks() >= model_.kv_floor_blocks,
              "wsa: kv pool of {} blocks below the floor of {}", eng.kv().num_blocks(),
              model_.kv_floor_blocks);
  stats_.max_bytes = std::max(stats_.max_bytes, bytes);
  stats_.min_kv_blocks = stats_.min_kv_blocks < 0
                             ? eng.kv().num_blocks()
                             : std::min(stats_.min_kv_blocks, eng.kv().num_blocks());
  return ok_status();
}

void LiveSplit::sync() {
  for (std::size_t i = 0; i < moe_layers_.size(); ++i) {
    current_.slots[i] = eng_.experts().pager()->capacity(moe_layers_[i]);
  }
  current_.kv_blocks = eng_.kv().num_blocks();
}

Status LiveSplit::on_step(Engine& eng) {
  kv_.record(double(eng.kv_demand().blocks()));
  observe_step_cost(eng);
  steps_ += 1;
  // A split that cannot be had now (the allocator finds none, or a resize is refused) is not a
  // serving failure: the pools stay as they are and serving goes on.
  const bool due = cadence_.step(step_accesses_, static_cast<int>(sd_.size()));
  step_accesses_ = 0;
  if (forced_) {
    const Split s = std::move(*forced_);
    forced_.reset();
    if (Status st = apply(eng, s); !st.ok()) {
      ++stats_.refused;
      stats_.last_refusal = st.to_string();
      sync();
      return ok_status();
    }
    ++stats_.forced;
    return ok_status();
  }
  if (!due) return ok_status();
  const Timer decide_clock;
  const SplitProblem p = decision_problem(eng);
  auto d = ctl_.decide(p, current_);
  stats_.decide_s += decide_clock.elapsed_s();
  ++stats_.decisions;
  if (ctl_.priced_by_caps(p)) ++stats_.priced_by_caps;
  DecisionRecord rec{.step = eng.stats().steps};
  if (!d.ok()) {
    ++stats_.refused;
    stats_.last_refusal = d.status().to_string();
  } else {
    rec.current_s = d->current_s;
    rec.target_s = d->target_s;
    rec.migration_s = d->migration_s;
    rec.threshold = d->band;
    rec.move = d->move;
    rec.target = d->target;
    if (d->move) {
      if (Status st = apply(eng, d->target); st.ok()) {
        ++stats_.moves;
        rec.applied = true;
      } else {
        ++stats_.refused;
        stats_.last_refusal = st.to_string();
        sync();
      }
    }
  }
  stats_.log.push_back(std::move(rec));
  const double age = cadence_.decided();
  for (StackDistance& s : sd_) s.scale(age);
  if (prefix_) prefix_->scale(age);
  prefill_cost_.scale(age);
  prefill_base_cost_.scale(age);
  chunks_.scale(age);
  steps_ *= age;
  return ok_status();
}

}  // namespace ferry::serve::wsa
