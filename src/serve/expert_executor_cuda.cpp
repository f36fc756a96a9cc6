// SPDX-License-Identifier: Apache-2.0
// ExpertExecutor's CUDA engine path (expert_executor.h, ExpertDevice): pointer tables, the static
// bulk copy on the copy stream, the paged groups' slot tables and the cpu-experts round trip.
// Memory (all allocated by create_device, none in run_device):
//   device  [L + max_tokens, 3, E] expert pointers: one fixed table per layer (resident, static),
//           then one per token group of a paged step (a step has at most max_tokens groups);
//           [max_tokens * K] row list (paged overlap: a group's rows ordered hits, then by copy)
//   pinned  the tables' and the row list's host mirrors, the routed ids [T*K], and for
//           cpu-experts and paged with miss placement x [T, C] and the expert rows [T*K, C]
// Reuse of the pinned mirror: a paged layer's groups use distinct table entries and distinct row
// list ranges (a token group [t0, t1) owns [t0*K, t1*K); expert groups take consecutive ranges
// of their row counts, which sum to T*K), and every paged or cpu-experts run_device
// starts by synchronizing compute (the ids read-back), so the previous layer's table and row list
// uploads and row copies have completed before their host memory is written again.
// Paged overlap (PagerConfig::overlap_misses), one group:
//   copy:     [wait compute's queue] miss 0 -> ev0, miss 1 -> ev1, ...          (pager.acquire)
//   compute:  table + row list up, FFN(hit rows) | wait ev0, FFN(rows of miss 0) | wait ev1, ...
// so the link is busy while the resident experts compute, and each missed expert computes while
// the next one is still copying; a row is written by exactly one launch, with the same bits.
// Paged miss placement, one MoE layer (the routed ids and x come back with one sync):
//   host:     resolve groups (on_host per miss), enqueue their slot rows as above | CPU: host rows
//             from the pinned store into h_eout (the whole thread pool) | H2D of each run of
//             consecutive host rows on compute
//   copy:     the slot misses (events)           (runs while the CPU computes)
//   compute:  tables, FFN of the slot rows       (runs while the CPU computes) | host rows land
// then the runner's combine on compute reads eout: every row is written before it. The CPU pass
// starts once every group is enqueued (no GPU work waits on the host inside the layer), and the
// next layer's ids sync orders h_x / h_eout's reuse after this layer's copies.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/thread_pool.h"
#include "serve/device_ops.h"
#include "serve/device_resolver.h"
#include "serve/expert_executor.h"
#include "serve/expert_ffn.h"

namespace ferry::serve {

struct ExpertExecutor::DeviceState {
  ExpertDevice dev;
  mem::MemoryBudget device_budget{mem::MemTier::kDevice};
  BudgetCharge charge;  // on the engine's device budget
  mem::Arena tables;    // [L + max_tokens, 3, E] const void* (expert weights, store dtype)
  mem::MemoryBudget host_budget{mem::MemTier::kPinnedHost};
  mem::Buffer h_tables, h_ids, h_x, h_eout, h_rows;
  mem::SlotId d_rows{1};        // [max_tokens * K] int32 in `tables`
  mem::Event consumed, staged;  // static: compute -> copy (staging reuse), copy -> compute
  // paged with device slot resolution and overlap: compute -> copy after the resolve (the hits'
  // FFN may start), copy -> compute once the hits' rows are written (the combine may read them)
  mem::Event resolved, hits_done;
  const void** host_table(std::int64_t index, int E) const {
    return reinterpret_cast<const void**>(h_tables.data()) + index * 3 * E;
  }
  const void* const* device_table(std::int64_t index, int E) const {
    return tables.as<const void*>(mem::SlotId{0}) + index * 3 * E;
  }
};

ExpertExecutor::ExpertExecutor(const model::DecoderGeometry& geo, const model::ModelParams& params,
                               mem::MemTier tier)
    : geo_(geo), params_(params), staging_budget_(tier) {}
ExpertExecutor::~ExpertExecutor() = default;

Status ExpertExecutor::create_device(const ExpertDevice& d, mem::MemoryBudget* shared) {
  if (d.te == nullptr || d.compute == nullptr || d.copy == nullptr || d.max_tokens <= 0) {
    return invalid_argument(
        "serve: a device executor needs a transfer engine, two streams and "
        "max_tokens");
  }
  auto s = std::make_unique<DeviceState>();
  s->dev = d;
  const int L = geo_.layers, E = geo_.experts, K = geo_.top_k;
  const std::int64_t T = d.max_tokens, C = geo_.hidden;
  const std::size_t table_bytes = std::size_t(L + T) * 3 * std::size_t(E) * sizeof(void*);
  const std::size_t rows_bytes = std::size_t(T * K) * sizeof(std::int32_t);
  mem::ArenaPlan plan;
  plan.add("expert pointer tables", table_bytes);
  s->d_rows = plan.add("expert row lists", rows_bytes);
  FERRY_ASSIGN_OR_RETURN(
      s->charge, BudgetCharge::take(shared, plan.allocation_bytes(), "expert pointer tables"));
  FERRY_ASSIGN_OR_RETURN(s->tables, mem::make_arena(plan, mem::MemTier::kDevice, s->device_budget,
                                                    {.what = "expert pointer tables"}));
  auto pinned = [&](std::size_t bytes, std::string_view what) {
    return mem::Buffer::allocate(mem::MemTier::kPinnedHost, bytes, s->host_budget, {.what = what});
  };
  FERRY_ASSIGN_OR_RETURN(s->h_tables, pinned(table_bytes, "expert pointer tables (host)"));
  FERRY_ASSIGN_OR_RETURN(s->h_ids,
                         pinned(std::size_t(T * K) * sizeof(std::int32_t), "routed ids (host)"));
  if (mode_ == ExpertMode::kPaged) {
    FERRY_ASSIGN_OR_RETURN(s->h_rows, pinned(rows_bytes, "expert row lists (host)"));
    FERRY_ASSIGN_OR_RETURN(s->resolved,
                           mem::Event::create(d.copy->device(), d.copy->device_index()));
    FERRY_ASSIGN_OR_RETURN(s->hits_done,
                           mem::Event::create(d.copy->device(), d.copy->device_index()));
  }
  if (mode_ == ExpertMode::kCpuExperts || placement_on()) {
    FERRY_ASSIGN_OR_RETURN(s->h_x, pinned(std::size_t(T * C) * sizeof(float), "expert x (host)"));
    FERRY_ASSIGN_OR_RETURN(s->h_eout,
                           pinned(std::size_t(T * K * C) * sizeof(float), "expert rows (host)"));
  }
  if (placement_on()) {  // a layer step's rows, split host / device: no growth in steps
    host_rows_.reserve(std::size_t(T * K));
    device_rows_.reserve(std::size_t(T * K));
  }
  if (mode_ == ExpertMode::kStatic) {
    FERRY_ASSIGN_OR_RETURN(s->consumed,
                           mem::Event::create(d.copy->device(), d.copy->device_index()));
    FERRY_ASSIGN_OR_RETURN(s->staged, mem::Event::create(d.copy->device(), d.copy->device_index()));
  }
  std::memset(s->h_tables.data(), 0, table_bytes);
  const std::size_t mat = std::size_t(geo_.expert_width) * std::size_t(C);
  for (int l = 0; l < L; ++l) {
    if (!geo_.layer_is_moe[l]) continue;
    const void** t = s->host_table(l, E);
    for (int e = 0; e < E; ++e) {
      ExpertRef r;
      if (mode_ == ExpertMode::kResident) {
        if (d.params == nullptr) return invalid_argument("serve: resident on CUDA needs weights");
        const auto& p = d.params->layers.at(std::size_t(l));
        for (const ConstTensorView* v :
             {&p.expert_gate.at(std::size_t(e)), &p.expert_up.at(std::size_t(e)),
              &p.expert_down.at(std::size_t(e))}) {
          if (v->device != Device::kCuda || v->dtype != expert_dtype_ ||
              std::size_t(v->numel()) != mat || !v->is_contiguous()) {
            return invalid_argument(
                "serve: layer {} expert {}: expected a contiguous {} device view of {} x {}", l, e,
                to_string(expert_dtype_), geo_.expert_width, C);
          }
        }
        r = {p.expert_gate[e].data, p.expert_up[e].data, p.expert_down[e].data, expert_dtype_};
      } else if (mode_ == ExpertMode::kStatic) {
        r = store_->ref_in(staging_.data(mem::SlotId{0}) +
                           std::int64_t(e) * std::int64_t(store_->expert_bytes()));
      } else {
        continue;  // paged: per group; cpu-experts: no table
      }
      t[e] = r.gate;
      t[E + e] = r.up;
      t[2 * E + e] = r.down;
    }
  }
  FERRY_TRY(d.te->h2d(s->tables.data(mem::SlotId{0}), s->h_tables.data(),
                      std::size_t(L) * 3 * std::size_t(E) * sizeof(void*), *d.compute));
  FERRY_TRY(d.compute->synchronize());
  dev_ = std::move(s);
  return ok_status();
}

void ExpertExecutor::count_replayed(const ExecutorCounters& d) {
  counters_.groups += d.groups;
  counters_.static_bytes_copied += d.static_bytes_copied;
  counters_.expert_rows += d.expert_rows;
  counters_.cpu_misses += d.cpu_misses;
  counters_.bypassed += d.bypassed;
  counters_.host_syncs += d.host_syncs;
  counters_.device_resolved += d.device_resolved;
}

Status ExpertExecutor::device_group(int layer, const float* d_x, const std::int32_t* d_ids,
                                    std::span<const std::int32_t> rows, std::int64_t list_offset,
                                    int group, float* d_act, float* d_eout) {
  DeviceState& s = *dev_;
  const int E = geo_.experts, K = geo_.top_k;
  const auto* h_ids = reinterpret_cast<const std::int32_t*>(s.h_ids.data());
  FERRY_TRY(resolve_group(layer, h_ids, rows));
  // The group is acquired from here. An enqueue below that fails must not leave it so (the
  // layer's next acquire would abort on "acquired twice"): compute is made to wait for every copy
  // of the batch (release() checks it: no later reader of, or copy into, these slots may race
  // them), then the group is released. Should even that wait fail, it stays acquired.
  struct ReleaseOnError {
    ExpertExecutor& x;
    int layer;
    mem::Stream& cs;
    bool armed = true;
    ~ReleaseOnError() {
      if (!armed) return;
      bool joined = true;
      if (x.pager_->overlaps_copies()) {
        for (std::size_t j = 0; j < x.expert_of_copy_.size(); ++j) {
          joined = x.pager_->wait_copy(static_cast<int>(j), cs).ok() && joined;
        }
      }
      if (joined) x.pager_->release(layer);
    }
  } release_on_error{*this, layer, *s.dev.compute};
  const std::uint64_t group_rows = rows.size();
  if (placement_on()) {
    // Rows of experts sent to the host leave this group's launches (and its table: no host
    // pointer reaches the device); run_device computes them after every group is enqueued.
    bool any = false;
    for (std::int32_t e : distinct_) any = any || host_expert_[std::size_t(e)];
    if (any) {
      device_rows_.clear();
      for (std::int32_t i : rows) {
        (host_expert_[std::size_t(h_ids[i])] ? host_rows_ : device_rows_).push_back(i);
      }
      rows = device_rows_;
    }
  }
  const std::int64_t n = std::int64_t(rows.size());
  if (n == 0) {  // every expert of the group runs on the host: nothing to launch
    release_on_error.armed = false;
    pager_->release(layer);
    ++counters_.groups;
    counters_.expert_rows += group_rows;
    return ok_status();
  }
  // A token group's rows are one range [i0, i0 + n); an expert group's are a list (so are the
  // device rows of a group with host experts, unless they happen to be consecutive).
  const bool range = rows.back() - rows.front() + 1 == n;
  const std::int64_t index = geo_.layers + group;
  const void** t = s.host_table(index, E);
  std::fill(t, t + 3 * E, nullptr);
  for (std::int32_t e : distinct_) {
    if (host_expert_[std::size_t(e)]) continue;  // false unless miss placement chose the host
    const ExpertRef& r = ref_of_expert_[std::size_t(e)];
    t[e] = r.gate;
    t[E + e] = r.up;
    t[2 * E + e] = r.down;
  }
  mem::Stream& cs = *s.dev.compute;
  FERRY_TRY(s.dev.te->h2d(s.tables.as<const void*>(mem::SlotId{0}) + index * 3 * E, t,
                          3 * std::size_t(E) * sizeof(void*), cs));
  device::ExpertFfnArgs a{.out = d_eout,
                          .act = d_act,
                          .x = d_x,
                          .ids = d_ids,
                          .table = s.device_table(index, E),
                          .row_begin = range ? rows.front() : 0,
                          .row_end = range ? rows.front() + n : 0,
                          .K = K,
                          .E = E,
                          .C = geo_.hidden,
                          .F = geo_.expert_width,
                          .bf16 = expert_dtype_ == DType::kBF16};
  const bool overlap = pager_->overlaps_copies() && !expert_of_copy_.empty();
  if (range && !overlap) {
    // Serial order (or nothing copied): one launch over the group's rows; with overlap off the
    // pager already made compute wait for the whole batch.
    FERRY_TRY(device::expert_ffn(a, cs));
  } else {
    // Through the row list, in this group's range of it [list_offset, list_offset + n). With
    // overlap, rows by readiness: resident experts' rows first, then each copy's expert's rows
    // (copy_of_expert: -1 resident, else its copy; all E entries of the group's experts are set
    // by resolve_group's copy_index); without, the rows as listed, in one launch.
    auto* h_rows = reinterpret_cast<std::int32_t*>(s.h_rows.data());
    std::int32_t* out = h_rows + list_offset;
    const std::span<const std::int32_t> routed(h_ids, std::size_t(rows.back()) + 1);
    std::int64_t first = n;  // rows of the first launch
    if (overlap) {
      first =
          order_rows_by_readiness(routed, rows, copy_of_expert_, expert_of_copy_, out, seg_end_);
    } else {
      std::copy(rows.begin(), rows.end(), out);
    }
    std::int32_t* d_rows = s.tables.as<std::int32_t>(s.d_rows);  // positions index it directly
    FERRY_TRY(s.dev.te->h2d(d_rows + list_offset, out, std::size_t(n) * sizeof(std::int32_t), cs));
    a.row_list = d_rows;
    a.row_begin = list_offset;
    a.row_end = list_offset + first;
    FERRY_TRY(device::expert_ffn(a, cs));  // no-op when every expert missed
    const int copies = overlap ? static_cast<int>(expert_of_copy_.size()) : 0;
    for (int j = 0; j < copies; ++j) {
      FERRY_TRY(pager_->wait_copy(j, cs));
      a.row_begin = a.row_end;
      a.row_end = list_offset + seg_end_[std::size_t(j)];
      FERRY_TRY(device::expert_ffn(a, cs));
    }
  }
  release_on_error.armed = false;
  pager_->release(layer);
  ++counters_.groups;
  counters_.expert_rows += group_rows;
  return ok_status();
}

Status ExpertExecutor::compute_host_rows(float* d_eout) {
  DeviceState& s = *dev_;
  const int K = geo_.top_k, E = geo_.experts;
  const std::int64_t C = geo_.hidden, F = geo_.expert_width;
  const auto* h_ids = reinterpret_cast<const std::int32_t*>(s.h_ids.data());
  const auto* h_x = reinterpret_cast<const float*>(s.h_x.data());
  auto* h_eout = reinterpret_cast<float*>(s.h_eout.data());
  // Routing order: the groups appended their host rows group by group; the runs below want them
  // ascending, and the kernels' bits do not depend on the order (expert_ffn_fast.h).
  std::sort(host_rows_.begin(), host_rows_.end());
  if (grouped_) {
    grouped_->run({.ref_of_expert = host_ref_.data(),
                   .ids = h_ids,
                   .rows = host_rows_.data(),
                   .n = std::int64_t(host_rows_.size()),
                   .x = h_x,
                   .out = h_eout,
                   .K = K,
                   .E = E,
                   .C = C,
                   .F = F},
                  ThreadPool::global());
  } else {
    ThreadPool::global().parallel_for(
        host_rows_.size(),
        [&](std::size_t b, std::size_t e) {
          thread_local std::vector<float> scratch;
          if (static_cast<std::int64_t>(scratch.size()) < F) scratch.resize(std::size_t(F));
          for (std::size_t r = b; r < e; ++r) {
            const std::int64_t i = host_rows_[r];
            expert_ffn_row(host_ref_[std::size_t(h_ids[i])], h_x + (i / K) * C, h_eout + i * C, C,
                           F, scratch.data());
          }
        },
        2);
  }
  // Up into their fixed rows of eout, one copy per run of consecutive rows, on compute: after
  // this layer's slot launches in stream order (disjoint rows), before the runner's combine.
  mem::Stream& cs = *s.dev.compute;
  for (std::size_t a = 0; a < host_rows_.size();) {
    std::size_t b = a + 1;
    while (b < host_rows_.size() && host_rows_[b] == host_rows_[b - 1] + 1) ++b;
    const std::int64_t i0 = host_rows_[a];
    FERRY_TRY(s.dev.te->h2d(d_eout + i0 * C, h_eout + i0 * C,
                            (b - a) * std::size_t(C) * sizeof(float), cs));
    a = b;
  }
  return ok_status();
}

Result<bool> ExpertExecutor::begin_device_step(std::int64_t T,
                                               std::span<const std::int64_t> experts) {
  FERRY_CHECK(!device_step_, "serve: begin_device_step twice without finish_device_step");
  FERRY_CHECK(experts.empty() || std::ssize(experts) == geo_.layers,
              "serve: {} expert bounds for {} layers", experts.size(), geo_.layers);
  if (dev_ == nullptr || !resolver_ || mode_ != ExpertMode::kPaged) return false;
  const std::int64_t rows = T * geo_.top_k;
  for (int l = 0; l < geo_.layers; ++l) {
    const std::int64_t distinct = experts.empty() ? rows : experts[std::size_t(l)];
    if (geo_.layer_is_moe[l] && !resolver_->fits(l, rows, distinct)) return false;
  }
  FERRY_TRY(resolver_->upload_stale(*dev_->dev.compute));
  device_step_ = true;
  return true;
}

Status ExpertExecutor::enqueue_device_log(mem::Stream& stream) {
  FERRY_CHECK(device_step_, "serve: enqueue_device_log outside a device step");
  return resolver_->enqueue_log_readback(stream);
}

Result<std::uint64_t> ExpertExecutor::finish_device_step() {
  FERRY_CHECK(device_step_, "serve: finish_device_step without begin_device_step");
  device_step_ = false;
  for (int l = 0; l < geo_.layers; ++l) {
    if (geo_.layer_is_moe[l]) ++layer_step_[std::size_t(l)];
  }
  FERRY_TRY(resolver_->replay(access_observer_));
  return resolver_->last_replay_bytes();
}

void ExpertExecutor::cancel_device_step() {
  device_step_ = false;
  if (resolver_) resolver_->mark_all_stale();
}

Status ExpertExecutor::run_device(int layer, const float* d_x, const std::int32_t* d_ids,
                                  std::int64_t T, float* d_act, float* d_eout) {
  FERRY_CHECK(dev_ != nullptr, "serve: run_device on a CPU executor");
  DeviceState& s = *dev_;
  FERRY_CHECK(T > 0 && T <= s.dev.max_tokens, "serve: {} tokens outside [1, {}]", T,
              s.dev.max_tokens);
  const int E = geo_.experts, K = geo_.top_k;
  const std::int64_t C = geo_.hidden, F = geo_.expert_width, rows = T * K;
  mem::Stream& cs = *s.dev.compute;
  if (device_step_) {
    // Device-side slot resolution: resolve, copy the misses, FFN — no host wait (the access
    // observer and the pager see the ids when finish_device_step replays the log). With overlap
    // (PagerConfig::overlap_misses, the default) the rows of experts that hit run on the copy
    // stream, which device steps leave idle (their miss copy is a kernel on compute), beside the
    // miss copy; the misses' rows run on compute after it, and compute waits for the hits before
    // the combine reads the rows. Disjoint rows, each written once, the same per-row arithmetic:
    // the same bits as the serial order (one launch after the copy).
    kernels::cuda::ExpertFfnArgs ffn{.out = d_eout,
                                     .act = d_act,
                                     .x = d_x,
                                     .ids = d_ids,
                                     .table = resolver_->table(layer),
                                     .row_begin = 0,
                                     .row_end = rows,
                                     .K = K,
                                     .E = E,
                                     .C = C,
                                     .F = F,
                                     .bf16 = expert_dtype_ == DType::kBF16};
    if (pager_->overlaps_copies()) {
      FERRY_TRY(resolver_->enqueue_resolve(layer, d_ids, rows, cs));
      mem::Stream& side = *s.dev.copy;
      FERRY_TRY(s.resolved.record(cs));
      FERRY_TRY(side.wait(s.resolved));
      ffn.row_filter = kernels::cuda::ExpertRowFilter::kHits;
      ffn.miss_log = resolver_->device_log(layer);
      FERRY_TRY(device::expert_ffn(ffn, side));
      FERRY_TRY(s.hits_done.record(side));
      // From here compute joins the hits whatever fails, so no hits launch outlives this layer's
      // compute work (an eager step that fails is not synchronized; a capture must not end with
      // an unjoined fork).
      Status misses = resolver_->enqueue_copy(layer, cs);
      if (misses.ok()) {
        ffn.row_filter = kernels::cuda::ExpertRowFilter::kMisses;
        misses = device::expert_ffn(ffn, cs);
      }
      const Status joined = cs.wait(s.hits_done);
      FERRY_TRY(misses);
      FERRY_TRY(joined);
    } else {
      FERRY_TRY(resolver_->enqueue(layer, d_ids, rows, cs));
      FERRY_TRY(device::expert_ffn(ffn, cs));
    }
    ++counters_.device_resolved;
    ++counters_.groups;
    counters_.expert_rows += std::uint64_t(rows);
    return ok_status();
  }
  mem::TransferEngine& te = *s.dev.te;
  const bool need_ids = mode_ == ExpertMode::kPaged || mode_ == ExpertMode::kCpuExperts ||
                        static_cast<bool>(access_observer_);
  auto* h_ids = reinterpret_cast<std::int32_t*>(s.h_ids.data());
  if (need_ids) {
    FERRY_TRY(te.d2h(h_ids, d_ids, std::size_t(rows) * sizeof(std::int32_t), cs));
    if (mode_ == ExpertMode::kCpuExperts || placement_on()) {
      // Miss placement: x before knowing whether a miss goes to the host (T*C floats, read back
      // under the same sync as the ids; no second round trip).
      FERRY_TRY(te.d2h(s.h_x.data(), d_x, std::size_t(T * C) * sizeof(float), cs));
    }
    ++counters_.host_syncs;
    FERRY_TRY(cs.synchronize());
    for (std::int64_t i = 0; i < rows; ++i) {
      if (h_ids[i] < 0 || h_ids[i] >= E) {
        return invalid_argument("serve: expert id {} outside [0, {})", h_ids[i], E);
      }
    }
    if (access_observer_) access_observer_(layer, std::span<const std::int32_t>(h_ids, rows));
  }
  const device::ExpertFfnArgs whole{.out = d_eout,
                                    .act = d_act,
                                    .x = d_x,
                                    .ids = d_ids,
                                    .table = s.device_table(layer, E),
                                    .row_begin = 0,
                                    .row_end = rows,
                                    .K = K,
                                    .E = E,
                                    .C = C,
                                    .F = F,
                                    .bf16 = expert_dtype_ == DType::kBF16};
  switch (mode_) {
    case ExpertMode::kResident:
      FERRY_TRY(device::expert_ffn(whole, cs));
      break;
    case ExpertMode::kStatic: {
      // The layer's blocks are contiguous in the store: one bulk copy on the copy stream, after
      // the previous layer's FFN (the staging area's last reader); compute waits for it.
      const std::size_t bytes = std::size_t(E) * store_->expert_bytes();
      FERRY_TRY(s.consumed.record(cs));
      FERRY_TRY(s.dev.copy->wait(s.consumed));
      FERRY_TRY(te.h2d(staging_.data(mem::SlotId{0}), store_->block(layer, 0), bytes, *s.dev.copy));
      FERRY_TRY(s.staged.record(*s.dev.copy));
      FERRY_TRY(cs.wait(s.staged));
      counters_.static_bytes_copied += bytes;
      FERRY_TRY(device::expert_ffn(whole, cs));
      break;
    }
    case ExpertMode::kCpuExperts: {
      const auto* h_x = reinterpret_cast<const float*>(s.h_x.data());
      auto* h_eout = reinterpret_cast<float*>(s.h_eout.data());
      if (grouped_) {  // the default (PagerConfig::cpu_expert_kernel): expert_ffn_fast.h
        for (std::int64_t i = 0; i < rows; ++i) {
          ref_of_expert_[std::size_t(h_ids[i])] = store_->ref(layer, h_ids[i]);
        }
        rows_.resize(std::size_t(rows));
        std::iota(rows_.begin(), rows_.end(), 0);
        grouped_->run({.ref_of_expert = ref_of_expert_.data(),
                       .ids = h_ids,
                       .rows = rows_.data(),
                       .n = rows,
                       .x = h_x,
                       .out = h_eout,
                       .K = K,
                       .E = E,
                       .C = C,
                       .F = F},
                      ThreadPool::global());
        FERRY_TRY(te.h2d(d_eout, h_eout, std::size_t(rows * C) * sizeof(float), cs));
        break;
      }
      ThreadPool::global().parallel_for(
          static_cast<std::size_t>(rows),
          [&](std::size_t b, std::size_t e) {
            thread_local std::vector<float> scratch;
            if (static_cast<std::int64_t>(scratch.size()) < F) scratch.resize(std::size_t(F));
            for (std::size_t r = b; r < e; ++r) {
              const std::int64_t i = static_cast<std::int64_t>(r), t = i / K;
              expert_ffn_row(store_->ref(layer, h_ids[i]), h_x + t * C, h_eout + i * C, C, F,
                             scratch.data());
            }
          },
          2);
      FERRY_TRY(te.h2d(d_eout, h_eout, std::size_t(rows * C) * sizeof(float), cs));
      break;
    }
    case ExpertMode::kPaged: {
      ++layer_step_[std::size_t(layer)];
      host_rows_.clear();
      std::int64_t list_offset = 0;  // each group's range of the row list
      FERRY_TRY(for_each_paged_group(
          layer, h_ids, T, [&](std::span<const std::int32_t> group_rows, int group) {
            const std::int64_t at = list_offset;
            list_offset += std::int64_t(group_rows.size());
            return device_group(layer, d_x, d_ids, group_rows, at, group, d_act, d_eout);
          }));
      // Miss placement: the host rows, computed while the GPU runs what the groups enqueued.
      if (!host_rows_.empty()) FERRY_TRY(compute_host_rows(d_eout));
      return ok_status();
    }
  }
  ++counters_.groups;
  counters_.expert_rows += std::uint64_t(rows);
  return ok_status();
}

}  // namespace ferry::serve
