// SPDX-License-Identifier: Apache-2.0
#include "serve/expert_executor.h"

#include <algorithm>
#include <numeric>

#include "core/thread_pool.h"
#include "mem/stream.h"
#include "mem/transfer_engine.h"
#include "serve/device_resolver.h"
#include "serve/pool_tier.h"

namespace ferry::serve {

std::vector<std::int64_t> split_token_groups(std::span<const std::int32_t> ids, std::int64_t T,
                                             int K, int E, int limit,
                                             const std::vector<bool>& hot) {
  std::vector<std::int64_t> ends;
  std::vector<bool> in_group(E, false);
  std::vector<std::int32_t> members;
  int count = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    int fresh = 0;
    for (int k = 0; k < K; ++k) {
      const std::int32_t e = ids[t * K + k];
      fresh += !in_group[e] && !(hot.empty() ? false : hot[e]);
    }
    if (count + fresh > limit && t > 0 && !members.empty()) {
      ends.push_back(t);
      for (std::int32_t e : members) in_group[e] = false;
      members.clear();
      count = 0;
    }
    for (int k = 0; k < K; ++k) {
      const std::int32_t e = ids[t * K + k];
      if (in_group[e]) continue;
      in_group[e] = true;
      members.push_back(e);
      count += !(hot.empty() ? false : hot[e]);
    }
  }
  if (T > 0) ends.push_back(T);
  return ends;
}

int split_expert_groups(std::span<const std::int32_t> ids, int E, int limit,
                        const std::vector<bool>& hot, const std::vector<bool>& resident,
                        std::vector<int>& group_of_expert) {
  FERRY_CHECK(limit >= 1, "serve: expert groups of at most {} experts", limit);
  group_of_expert.assign(std::size_t(E), -1);
  std::vector<std::int32_t> order;  // distinct experts, first appearance
  std::vector<bool> seen(std::size_t(E), false);
  for (std::int32_t e : ids) {
    if (seen[std::size_t(e)]) continue;
    seen[std::size_t(e)] = true;
    order.push_back(e);
  }
  const auto is = [](const std::vector<bool>& v, std::int32_t e) {
    return !v.empty() && v[std::size_t(e)];
  };
  int group = 0, count = 0;
  const auto place = [&](std::int32_t e) {
    if (count == limit) {
      ++group;
      count = 0;
    }
    group_of_expert[std::size_t(e)] = group;
    ++count;
  };
  for (std::int32_t e : order) {
    if (is(hot, e)) group_of_expert[std::size_t(e)] = 0;  // never counts against the limit
  }
  for (std::int32_t e : order) {
    if (!is(hot, e) && is(resident, e)) place(e);
  }
  for (std::int32_t e : order) {
    if (!is(hot, e) && !is(resident, e)) place(e);
  }
  return order.empty() ? 0 : group + 1;
}

void rows_of_group(std::span<const std::int32_t> ids, std::span<const int> group_of_expert, int g,
                   std::vector<std::int32_t>& out) {
  out.clear();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (group_of_expert[std::size_t(ids[i])] == g) out.push_back(std::int32_t(i));
  }
}

std::int64_t order_rows_by_readiness(std::span<const std::int32_t> ids,
                                     std::span<const std::int32_t> rows,
                                     std::span<const int> copy_of_expert,
                                     std::span<const std::int32_t> expert_of_copy,
                                     std::int32_t* out, std::vector<std::int64_t>& seg_end) {
  std::int64_t n = 0;
  for (std::int32_t i : rows) {
    if (copy_of_expert[std::size_t(ids[i])] < 0) out[n++] = i;
  }
  const std::int64_t resident = n;
  seg_end.clear();
  // One pass per copy: a group has few copies (at most its distinct experts), and this keeps
  // each expert's rows in the list's order without a sort.
  for (const std::int32_t e : expert_of_copy) {
    for (std::int32_t i : rows) {
      if (ids[i] == e) out[n++] = i;
    }
    seg_end.push_back(n);
  }
  FERRY_CHECK(n == std::int64_t(rows.size()),
              "serve: {} rows ordered for a group of {} (an expert neither resident "
              "nor copied)",
              n, rows.size());
  return resident;
}

std::int64_t order_rows_by_readiness(std::span<const std::int32_t> ids, std::int64_t i0,
                                     std::int64_t i1, std::span<const int> copy_of_expert,
                                     std::span<const std::int32_t> expert_of_copy,
                                     std::int32_t* out, std::vector<std::int64_t>& seg_end) {
  std::vector<std::int32_t> rows(std::size_t(i1 - i0));
  std::iota(rows.begin(), rows.end(), std::int32_t(i0));
  return order_rows_by_readiness(ids, rows, copy_of_expert, expert_of_copy, out, seg_end);
}

Result<std::vector<int>> resolve_expert_caps(const model::DecoderGeometry& geo,
                                             std::size_t expert_bytes, const PagerConfig& pc) {
  int moe_layers = 0;
  for (bool m : geo.layer_is_moe) moe_layers += m;
  std::vector<int> caps(geo.layers, 0);
  for (int l = 0; l < geo.layers; ++l) {
    if (!geo.layer_is_moe[l]) continue;
    int cap = geo.experts;
    if (!pc.layer_slots.empty()) {
      if (static_cast<int>(pc.layer_slots.size()) != geo.layers) {
        return invalid_argument("serve: {} per-layer slot counts for {} layers",
                                pc.layer_slots.size(), geo.layers);
      }
      cap = pc.layer_slots[l];
    } else if (pc.slots_per_layer > 0) {
      cap = pc.slots_per_layer;
    } else if (pc.budget_bytes > 0) {
      cap = static_cast<int>(std::min<std::size_t>(
          pc.budget_bytes / (expert_bytes * std::size_t(moe_layers)), std::size_t(geo.experts)));
    }
    cap = std::min(cap, geo.experts);
    if (cap < geo.top_k) {
      return resource_exhausted(
          "serve: layer {} gets {} expert slots (expert budget {}, {} per expert, {} MoE "
          "layers), fewer than top-k = {}: one token's experts would not fit",
          l, cap, mem::format_bytes(pc.budget_bytes), mem::format_bytes(expert_bytes), moe_layers,
          geo.top_k);
    }
    caps[l] = cap;
  }
  return caps;
}

Result<std::unique_ptr<ExpertExecutor>> ExpertExecutor::create(const model::DecoderGeometry& geo,
                                                               const model::ModelParams& params,
                                                               const PagerConfig& pc,
                                                               mem::MemoryBudget* shared,
                                                               const ExpertDevice* dev) {
  const mem::MemTier tier = dev != nullptr ? mem::MemTier::kDevice : cpu_engine_pool_tier();
  std::unique_ptr<ExpertExecutor> x(new ExpertExecutor(geo, params, tier));
  x->mode_ = pc.mode;
  x->expert_dtype_ = pc.expert_dtype;
  if (geo.experts == 0) return x;  // dense model: nothing to page
  x->ref_of_expert_.resize(geo.experts);
  x->seen_.assign(geo.experts, false);
  x->distinct_.reserve(geo.experts);
  x->distinct_refs_.reserve(geo.experts);
  if (pc.expert_dtype != DType::kF32 && pc.expert_dtype != DType::kBF16) {
    return invalid_argument("serve: experts can be stored in f32 or bf16, not {}",
                            to_string(pc.expert_dtype));
  }
  if (dev == nullptr && pc.expert_dtype != DType::kF32) {
    // The CPU engine's resident mode reads the model's own f32 views; bf16 slots beside them
    // would break the identity between modes.
    return unimplemented(
        "serve: {} experts need the CUDA engine (--device cuda); the CPU engine keeps experts in "
        "f32",
        to_string(pc.expert_dtype));
  }
  x->cpu_kernel_ = pc.cpu_expert_kernel;
  if (x->cpu_kernel_ == CpuExpertKernel::kDefault) {
    // The CUDA engine's cpu-experts cannot match its GPU modes' bits anyway; the CPU engine's
    // does, through the exact kernel (docs/serve.md "Byte identity").
    x->cpu_kernel_ = dev != nullptr ? CpuExpertKernel::kFast : CpuExpertKernel::kExact;
  }
  if (pc.mode == ExpertMode::kCpuExperts && x->cpu_kernel_ == CpuExpertKernel::kFast) {
    x->grouped_ = std::make_unique<ExpertFfnGrouped>();
    if (dev != nullptr)
      x->grouped_->reserve(dev->max_tokens * geo.top_k, geo.expert_width, geo.experts);
  }
  if (pc.mode == ExpertMode::kResident) {
    if (dev != nullptr) FERRY_TRY(x->create_device(*dev, shared));
    return x;
  }
  if (pc.host_store != nullptr) {
    const ExpertStore& hs = *pc.host_store;
    bool same_layers = hs.layers() == geo.layers;
    for (int l = 0; same_layers && l < geo.layers; ++l) {
      same_layers = hs.has_layer(l) == bool(geo.layer_is_moe[l]);
    }
    if (hs.dtype() != pc.expert_dtype || hs.hidden() != geo.hidden ||
        hs.width() != geo.expert_width || hs.experts() != geo.experts || !same_layers) {
      return invalid_argument(
          "serve: the given host expert store ({} experts of {} x {} in {}, {} MoE layers) does "
          "not match the model ({} of {} x {} in {})",
          hs.experts(), hs.width(), hs.hidden(), to_string(hs.dtype()), hs.moe_layers(),
          geo.experts, geo.expert_width, geo.hidden, to_string(pc.expert_dtype));
    }
    x->store_ = pc.host_store;
  } else {
    FERRY_ASSIGN_OR_RETURN(x->own_store_, ExpertStore::create(geo, params, pc.expert_dtype));
    x->store_ = x->own_store_.get();
  }
  const std::size_t eb = x->store_->expert_bytes();
  if (pc.mode == ExpertMode::kStatic) {
    const std::size_t need = std::size_t(geo.experts) * eb;
    FERRY_TRY(x->staging_budget_.set_limit(pc.budget_bytes > 0 ? pc.budget_bytes : need));
    if (need > x->staging_budget_.bytes_limit()) {
      return resource_exhausted(
          "serve: static mode stages a whole layer ({} experts, {}), the expert budget is {}",
          geo.experts, mem::format_bytes(need), mem::format_bytes(pc.budget_bytes));
    }
    mem::ArenaPlan plan;
    plan.add("static expert staging", need);
    FERRY_ASSIGN_OR_RETURN(x->staging_charge_, BudgetCharge::take(shared, plan.allocation_bytes(),
                                                                  "static expert staging"));
    FERRY_ASSIGN_OR_RETURN(x->staging_, mem::make_arena(plan, tier, x->staging_budget_,
                                                        {.what = "static expert staging"}));
  } else if (pc.mode == ExpertMode::kPaged) {
    FERRY_ASSIGN_OR_RETURN(std::vector<int> caps, resolve_expert_caps(geo, eb, pc));
    std::vector<int> max_caps;
    if (pc.resizable) {
      for (int l = 0; l < geo.layers; ++l)
        max_caps.push_back(geo.layer_is_moe[l] ? geo.experts : 0);
    }
    PagerSetup setup{.caps = caps,
                     .max_caps = max_caps,
                     .granularity_bytes = pc.granularity_bytes,
                     .policy = pc.policy,
                     .lfru_half_life = pc.lfru_half_life,
                     .hot = pc.hot_experts,
                     .budget_bytes = pc.resizable ? 0 : pc.budget_bytes,
                     .shared = shared,
                     .te = dev != nullptr ? dev->te : nullptr,
                     .copy = dev != nullptr ? dev->copy : nullptr,
                     .compute = dev != nullptr ? dev->compute : nullptr,
                     .overlap = dev != nullptr && pc.overlap_misses};
    FERRY_ASSIGN_OR_RETURN(x->pager_, ExpertPager::create(*x->store_, setup));
    for (int l = 0; l < geo.layers; ++l) {
      if (geo.layer_is_moe[l] && x->pager_->group_limit(l) < geo.top_k) {
        return invalid_argument(
            "serve: layer {}: {} slots minus {} hot experts leave {} for routed experts, fewer "
            "than top-k = {}",
            l, x->pager_->capacity(l), x->pager_->hot_count(l), x->pager_->group_limit(l),
            geo.top_k);
      }
    }
    if (!(pc.link_gbps > 0) || !(pc.cpu_gflops > 0) || pc.bypass_window < 0) {
      return invalid_argument(
          "serve: miss placement needs link_gbps > 0, cpu_gflops > 0 and bypass_window >= 0 (got "
          "{}, {}, {})",
          pc.link_gbps, pc.cpu_gflops, pc.bypass_window);
    }
    x->placement_ = pc;
    if (pc.miss_cost_model && pc.measure_cpu_gflops) {
      // The kernel the host path runs: the CUDA engine's cpu_expert_kernel, the CPU engine's
      // expert_ffn_row (compute_rows without grouped_).
      const CpuExpertKernel k = dev != nullptr ? x->cpu_kernel_ : CpuExpertKernel::kExact;
      FERRY_ASSIGN_OR_RETURN(x->measured_rate_,
                             measure_cpu_expert_rate(*x->store_, k, ThreadPool::global()));
      x->placement_.cpu_gflops = x->measured_rate_->gflops;
    }
    if (dev != nullptr && x->placement_on() && x->cpu_kernel_ == CpuExpertKernel::kFast) {
      x->grouped_ = std::make_unique<ExpertFfnGrouped>();
      x->grouped_->reserve(dev->max_tokens * geo.top_k, geo.expert_width, geo.experts);
    }
    x->host_expert_.assign(static_cast<std::size_t>(geo.experts), false);
    x->host_ref_.resize(static_cast<std::size_t>(geo.experts));
    x->layer_step_.assign(static_cast<std::size_t>(geo.layers), 0);
    x->last_use_.assign(static_cast<std::size_t>(geo.layers),
                        std::vector<std::uint64_t>(static_cast<std::size_t>(geo.experts), 0));
    x->paged_.reserve(static_cast<std::size_t>(geo.experts));
    x->paged_refs_.reserve(static_cast<std::size_t>(geo.experts));
    x->copy_index_.reserve(static_cast<std::size_t>(geo.experts));
    x->expert_of_copy_.reserve(static_cast<std::size_t>(geo.experts));
    x->copy_of_expert_.assign(static_cast<std::size_t>(geo.experts), -1);
    x->seg_end_.reserve(static_cast<std::size_t>(geo.experts));
    x->rows_of_expert_.assign(static_cast<std::size_t>(geo.experts), 0);
    x->hot_.assign(geo.layers, std::vector<bool>(geo.experts, false));
    for (int l = 0; l < geo.layers; ++l) {
      if (!geo.layer_is_moe[l]) continue;
      for (int e = 0; e < geo.experts; ++e) x->hot_[l][e] = x->pager_->is_hot(l, e);
    }
  }
  if (dev != nullptr) FERRY_TRY(x->create_device(*dev, shared));
  if (pc.mode == ExpertMode::kPaged && pc.device_resolve && !pc.miss_cost_model &&
      pc.bypass_window == 0) {
    // Every eviction policy (the kernel reproduces LRU, LFU and LFRU's exact decisions); miss
    // placement and bypass admission keep the host path (docs/serve.md).
    const SlotResolverDevice rd{.te = dev != nullptr ? dev->te : nullptr,
                                .pace_gbps = dev != nullptr ? dev->pace_gbps : 0.0};
    FERRY_ASSIGN_OR_RETURN(x->resolver_, SlotResolver::create(geo, *x->pager_, *x->store_, shared,
                                                              dev != nullptr ? &rd : nullptr));
  }
  return x;
}

std::int64_t ExpertExecutor::distinct_experts(const std::int32_t* ids, std::int64_t n) {
  std::int64_t d = 0;
  bool invalid = false;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t e = ids[i];
    if (e < 0 || e >= geo_.experts) {
      invalid = true;  // the resolver counts it an error: say as many as rows
    } else if (!seen_[std::size_t(e)]) {
      seen_[std::size_t(e)] = true;
      ++d;
    }
  }
  for (std::int64_t i = 0; i < n; ++i) {
    if (ids[i] >= 0 && ids[i] < geo_.experts) seen_[std::size_t(ids[i])] = false;
  }
  return invalid ? n : d;
}

Status ExpertExecutor::resize_caps(std::span<const int> caps) {
  if (!pager_) return invalid_argument("serve: expert caps can only be resized in paged mode");
  if (static_cast<int>(caps.size()) != geo_.layers) {
    return invalid_argument("serve: {} caps for {} layers", caps.size(), geo_.layers);
  }
  for (int l = 0; l < geo_.layers; ++l) {
    if (geo_.layer_is_moe[l] && caps[l] - pager_->hot_count(l) < geo_.top_k) {
      return invalid_argument("serve: layer {}: cap {} minus {} hot experts is below top-k = {}", l,
                              caps[l], pager_->hot_count(l), geo_.top_k);
    }
  }
  if (resolver_) resolver_->mark_all_stale();  // rewritten from the pager before the next use
  return pager_->resize(caps);
}

std::size_t ExpertExecutor::device_bytes() const {
  if (pager_) return pager_->held_bytes();
  return staging_.total_bytes();
}

Status ExpertExecutor::resolve_group(int layer, const std::int32_t* ids,
                                     std::span<const std::int32_t> rows) {
  // Distinct experts of the group, in first-appearance order.
  distinct_.clear();
  for (std::int32_t i : rows) {
    if (!seen_[ids[i]]) {
      seen_[ids[i]] = true;
      distinct_.push_back(ids[i]);
    }
  }
  for (std::int32_t e : distinct_) seen_[e] = false;
  distinct_refs_.resize(distinct_.size());
  switch (mode_) {
    case ExpertMode::kResident: {
      const auto& p = params_.layers[layer];
      for (std::size_t i = 0; i < distinct_.size(); ++i) {
        const int e = distinct_[i];
        distinct_refs_[i] = {p.expert_gate[e].data, p.expert_up[e].data, p.expert_down[e].data,
                             DType::kF32};  // create() refused other dtypes on the CPU engine
      }
      break;
    }
    case ExpertMode::kCpuExperts:
      for (std::size_t i = 0; i < distinct_.size(); ++i) {
        distinct_refs_[i] = store_->ref(layer, distinct_[i]);
      }
      break;
    case ExpertMode::kStatic:
      for (std::size_t i = 0; i < distinct_.size(); ++i) {
        distinct_refs_[i] = store_->ref_in(staging_.data(mem::SlotId{0}) +
                                           distinct_[i] * std::int64_t(store_->expert_bytes()));
      }
      break;
    case ExpertMode::kPaged: {
      // Miss placement: each distinct expert goes to a slot (hits, admitted misses) or is
      // computed from the host store (cost model, bypass); the pager sees only the former.
      if (placement_.miss_cost_model) {  // rows per expert, one pass over the group's ids
        for (std::int32_t e : distinct_) rows_of_expert_[std::size_t(e)] = 0;
        for (std::int32_t j : rows) ++rows_of_expert_[std::size_t(ids[j])];
      }
      int free = placement_.bypass_window > 0 ? pager_->free_slots(layer) : 0;
      paged_.clear();
      for (std::size_t i = 0; i < distinct_.size(); ++i) {
        const std::int32_t e = distinct_[i];
        const bool host = on_host(layer, e, free);
        host_expert_[std::size_t(e)] = host;
        if (host) {
          distinct_refs_[i] = store_->ref(layer, e);
          host_ref_[std::size_t(e)] = distinct_refs_[i];
        } else {
          paged_.push_back(e);
        }
      }
      paged_refs_.resize(paged_.size());
      copy_index_.resize(paged_.size());
      FERRY_TRY(pager_->acquire(layer, paged_, paged_refs_, copy_index_));
      if (resolver_) resolver_->mark_stale(layer);  // the device state no longer mirrors it
      expert_of_copy_.clear();
      for (std::int32_t e : distinct_) copy_of_expert_[std::size_t(e)] = -1;
      for (std::size_t i = 0; i < paged_.size(); ++i) {
        const int j = copy_index_[i];
        if (j < 0) continue;
        if (expert_of_copy_.size() <= std::size_t(j))
          expert_of_copy_.resize(std::size_t(j) + 1, -1);
        expert_of_copy_[std::size_t(j)] = paged_[i];
        copy_of_expert_[std::size_t(paged_[i])] = j;
      }
      for (std::size_t i = 0, j = 0; i < distinct_.size(); ++i) {
        if (j < paged_.size() && paged_[j] == distinct_[i]) distinct_refs_[i] = paged_refs_[j++];
      }
      const std::uint64_t step = layer_step_[std::size_t(layer)];
      for (std::int32_t e : distinct_) last_use_[std::size_t(layer)][std::size_t(e)] = step;
      break;
    }
  }
  for (std::size_t i = 0; i < distinct_.size(); ++i)
    ref_of_expert_[distinct_[i]] = distinct_refs_[i];
  return ok_status();
}

Status ExpertExecutor::compute_group(int layer, const float* x, const std::int32_t* ids,
                                     std::span<const std::int32_t> rows, float* eout) {
  FERRY_TRY(resolve_group(layer, ids, rows));
  compute_rows(x, ids, rows, eout);
  if (mode_ == ExpertMode::kPaged) pager_->release(layer);
  ++counters_.groups;
  counters_.expert_rows += rows.size();
  return ok_status();
}

void ExpertExecutor::compute_rows(const float* x, const std::int32_t* ids,
                                  std::span<const std::int32_t> rows, float* eout) {
  const int K = geo_.top_k;
  const std::int64_t C = geo_.hidden, F = geo_.expert_width;
  if (grouped_) {  // cpu-experts with the fast kernel: the rows at once, grouped by expert
    grouped_->run({.ref_of_expert = ref_of_expert_.data(),
                   .ids = ids,
                   .rows = rows.data(),
                   .n = std::int64_t(rows.size()),
                   .x = x,
                   .out = eout,
                   .K = K,
                   .E = geo_.experts,
                   .C = C,
                   .F = F},
                  ThreadPool::global());
    return;
  }
  ThreadPool::global().parallel_for(
      rows.size(),
      [&](std::size_t b, std::size_t e) {
        thread_local std::vector<float> scratch;
        if (static_cast<std::int64_t>(scratch.size()) < F) scratch.resize(F);
        for (std::size_t r = b; r < e; ++r) {
          const std::int64_t i = rows[r];
          const std::int64_t t = i / K;
          expert_ffn_row(ref_of_expert_[ids[i]], x + t * C, eout + i * C, C, F, scratch.data());
        }
      },
      2);
}

Status ExpertExecutor::for_each_paged_group(
    int layer, const std::int32_t* ids, std::int64_t T,
    const std::function<Status(std::span<const std::int32_t>, int)>& group) {
  const int K = geo_.top_k, E = geo_.experts;
  const std::span<const std::int32_t> all(ids, std::size_t(T * K));
  const std::vector<std::int64_t> ends =
      split_token_groups(all, T, K, E, pager_->group_limit(layer), hot_[layer]);
  if (ends.size() == 1) {  // everything fits: the step's rows in one group
    rows_.resize(all.size());
    std::iota(rows_.begin(), rows_.end(), 0);
    return group(rows_, 0);
  }
  resident_.assign(std::size_t(E), false);
  for (int e = 0; e < E; ++e) resident_[std::size_t(e)] = pager_->is_resident(layer, e);
  const int groups = split_expert_groups(all, E, pager_->group_limit(layer), hot_[layer], resident_,
                                         group_of_expert_);
  for (int g = 0; g < groups; ++g) {
    rows_of_group(all, group_of_expert_, g, rows_);
    FERRY_TRY(group(rows_, g));
  }
  return ok_status();
}

bool ExpertExecutor::on_host(int layer, std::int32_t e, int& free) {
  if (pager_->is_resident(layer, e) || pager_->is_hot(layer, e)) return false;  // a hit
  if (placement_.miss_cost_model) {
    const double C = geo_.hidden, F = geo_.expert_width;
    const double copy_s = double(store_->expert_bytes()) / (placement_.link_gbps * 1e9);
    const double cpu_s =
        double(rows_of_expert_[std::size_t(e)]) * 6.0 * C * F / (placement_.cpu_gflops * 1e9);
    if (cpu_s < copy_s) {
      ++counters_.cpu_misses;
      return true;
    }
  }
  if (placement_.bypass_window > 0) {
    if (free > 0) {  // admitted into an empty slot: no eviction, nothing to bypass
      --free;
      return false;
    }
    const std::uint64_t step = layer_step_[std::size_t(layer)];
    const std::uint64_t last = last_use_[std::size_t(layer)][std::size_t(e)];
    if (last == 0 || step - last > std::uint64_t(placement_.bypass_window)) {
      ++counters_.bypassed;
      return true;
    }
  }
  return false;
}

Status ExpertExecutor::run(int layer, const float* x, const std::int32_t* ids, std::int64_t T,
                           float* eout) {
  const int K = geo_.top_k;
  for (std::int64_t i = 0; i < T * K; ++i) {
    if (ids[i] < 0 || ids[i] >= geo_.experts) {
      return invalid_argument("serve: expert id {} outside [0, {})", ids[i], geo_.experts);
    }
  }
  if (access_observer_) {
    access_observer_(layer, std::span<const std::int32_t>(ids, std::size_t(T * K)));
  }
  if (mode_ == ExpertMode::kStatic) {
    // The layer's blocks are contiguous in the store: one bulk copy, one sync.
    const std::size_t bytes = std::size_t(geo_.experts) * store_->expert_bytes();
    mem::Stream& stream = mem::Stream::host();
    FERRY_TRY(mem::host_transfer_engine().h2d(staging_.data(mem::SlotId{0}),
                                              store_->block(layer, 0), bytes, stream));
    FERRY_TRY(stream.synchronize());
    counters_.static_bytes_copied += bytes;
  }
  if (mode_ != ExpertMode::kPaged) {
    rows_.resize(std::size_t(T * K));
    std::iota(rows_.begin(), rows_.end(), 0);
    return compute_group(layer, x, ids, rows_, eout);
  }
  ++layer_step_[std::size_t(layer)];
  if (resolver_ && resolver_->fits(layer, T * K, distinct_experts(ids, T * K))) {
    // The device path's CPU twin: slots resolved over the resolver's arrays, misses copied from
    // the store, the pager replaying the call (the observer above already saw the ids).
    FERRY_TRY(resolver_->run_cpu(layer, ids, T * K, {}));
    const void* const* tb = resolver_->table(layer);
    const int E = geo_.experts;
    for (std::int64_t i = 0; i < T * K; ++i) {
      const std::int32_t e = ids[i];
      ref_of_expert_[std::size_t(e)] = {tb[e], tb[E + e], tb[2 * E + e], store_->dtype()};
    }
    rows_.resize(std::size_t(T * K));
    std::iota(rows_.begin(), rows_.end(), 0);
    compute_rows(x, ids, rows_, eout);
    ++counters_.device_resolved;
    ++counters_.groups;
    counters_.expert_rows += rows_.size();
    return ok_status();
  }
  return for_each_paged_group(layer, ids, T, [&](std::span<const std::int32_t> rows, int) {
    return compute_group(layer, x, ids, rows, eout);
  });
}

}  // namespace ferry::serve
