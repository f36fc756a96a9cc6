// SPDX-License-Identifier: Apache-2.0
// ExpertExecutor: runs the routed experts of one MoE layer for a step's tokens in the configured
// mode, writing eout[t*K + k] = expert ids[t,k] (x[t]). The combine (weights, routing order) is
// the caller's, through the backend's moe_combine, so it never sees where an expert ran.
//   resident     refs point at the model's own weight views
//   cpu-experts  refs point at the packed host store (on a GPU build: computed by the CPU; here
//                the CPU is the only compute, so it is the same arithmetic on other pointers)
//   static       the layer's E blocks are copied in bulk into a device staging area (one batch)
//                every forward, refs point there (WiSP's baseline)
//   paged        a step whose distinct non-hot experts fit the layer's slots is one group; a step
//                that needs more (prefill, several streams) is split by experts
//                (split_expert_groups: each expert in one group, resident ones first), so a layer
//                step copies each missed expert once; each group is acquire()d from the pager,
//                computed over its rows, released
// Every mode calls expert_ffn_row per (t, k) with the same x row, so the bits are equal
// (expert_ffn.h) — except cpu-experts with PagerConfig::cpu_expert_kernel = kFast (the CUDA
// engine's default), which runs the step's rows through ExpertFfnGrouped (expert_ffn_fast.h):
// within a tolerance, not bitwise; and on the CUDA engine, paged misses that miss placement sends
// to the host (CPU arithmetic beside GPU rows). Not thread-safe; uses ThreadPool::global() inside.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/result.h"
#include "mem/arena.h"
#include "serve/cpu_expert_rate.h"
#include "serve/expert_ffn_fast.h"
#include "serve/expert_pager.h"
#include "serve/expert_store.h"
#include "serve/pool_tier.h"
#include "serve/serve_config.h"

namespace ferry::serve {

struct ExecutorCounters {
  std::uint64_t groups = 0;               // expert groups computed (paged may split a step)
  std::uint64_t static_bytes_copied = 0;  // static mode's bulk copies
  std::uint64_t expert_rows = 0;          // (token, k) rows computed
  // Paged misses not copied (PagerConfig's miss placement): computed from the host store because
  // the cost model found that cheaper, or bypassed by admission (a one-off; no eviction).
  std::uint64_t cpu_misses = 0, bypassed = 0;
  // CUDA engine: host waits for the routed ids (paged, cpu-experts: one per MoE layer and step).
  std::uint64_t host_syncs = 0;
  // Layer calls resolved by device-side slot resolution (or its CPU twin) instead of the host
  // pager's acquire (PagerConfig::device_resolve).
  std::uint64_t device_resolved = 0;
};

// Splits tokens [0, T) into consecutive groups whose distinct experts not in `hot` number at most
// `limit`; returns the group ends (the last is T). A single token needs at most K <= limit.
std::vector<std::int64_t> split_token_groups(std::span<const std::int32_t> ids, std::int64_t T,
                                             int K, int E, int limit, const std::vector<bool>& hot);

// A paged layer step whose distinct experts (not in `hot`) exceed `limit`: the experts split
// into groups of at most `limit` non-hot ones — those `resident` marks (already in a slot) first,
// so they compute before anything evicts them, then the rest in first-appearance order; hot
// experts join group 0. Every routed expert is in exactly one group, so the step copies each
// missed expert once; split_token_groups' consecutive token groups copy an expert again for every
// later group that routes to it after it was evicted (a 128-token prefill of Qwen3-30B-A3B at 42
// slots per layer routes to nearly all 128 experts of a layer, ~8 new ones per token: some 25
// token groups, estimated). Fills group_of_expert [E] (-1: not routed); returns the number of
// groups.
int split_expert_groups(std::span<const std::int32_t> ids, int E, int limit,
                        const std::vector<bool>& hot, const std::vector<bool>& resident,
                        std::vector<int>& group_of_expert);
// The rows i of `ids` whose expert is in group g, in routing order.
void rows_of_group(std::span<const std::int32_t> ids, std::span<const int> group_of_expert, int g,
                   std::vector<std::int32_t>& out);

// The paged CUDA executor's launch order for one token group (rows i in [i0, i1) of a routing
// `ids`): writes to out[0, i1 - i0) first the rows whose expert is resident (copy_of_expert[e] <
// 0), then the rows of expert_of_copy[0], then of expert_of_copy[1], ...; each group in routing
// order. seg_end[j] (resized to expert_of_copy.size()) is the end in `out` of copy j's rows; the
// return value is the number of resident rows. Every row appears exactly once (every routed
// expert of the group must be resident or in expert_of_copy: a bug otherwise).
std::int64_t order_rows_by_readiness(std::span<const std::int32_t> ids, std::int64_t i0,
                                     std::int64_t i1, std::span<const int> copy_of_expert,
                                     std::span<const std::int32_t> expert_of_copy,
                                     std::int32_t* out, std::vector<std::int64_t>& seg_end);
// The same over a list of rows (an expert group's), each kept in the list's order.
std::int64_t order_rows_by_readiness(std::span<const std::int32_t> ids,
                                     std::span<const std::int32_t> rows,
                                     std::span<const int> copy_of_expert,
                                     std::span<const std::int32_t> expert_of_copy,
                                     std::int32_t* out, std::vector<std::int64_t>& seg_end);

// The per-layer slot counts a PagerConfig asks for ([L], 0 for dense layers), or
// resource_exhausted when a MoE layer would get fewer than top-k slots.
Result<std::vector<int>> resolve_expert_caps(const model::DecoderGeometry& geo,
                                             std::size_t expert_bytes, const PagerConfig& pc);

// The CUDA engine's side of the executor (docs/serve.md "CUDA path"). Expert FFNs run on
// `compute` through serve/device_ops.h's expert_ffn, which reads each expert's weights through a
// [3, E] pointer table in GPU memory, so only pointers differ between modes:
//   resident     the table points at `params`' experts (device views), fixed at create()
//   static       the table points into a device staging area, refilled in bulk on `copy` every
//                forward (compute waits on an event), fixed at create()
//   paged        the routed ids are read back (one D2H + sync per MoE layer), the host pager
//                resolves each token group to slots (misses copied in one batch on `copy`,
//                pager.h), and the group's table is uploaded before its expert_ffn; with
//                PagerConfig::overlap_misses (default) the rows of the group's resident experts
//                run while the batch is in flight and each missed expert's rows run once its own
//                copy has landed (events), else one launch after the whole batch
//   cpu-experts  x and ids read back, experts computed by the CPU from the pinned host store
//                (ExpertFfnGrouped by default; expert_ffn_row with cpu_expert_kernel = kExact),
//                rows copied up: not bit-identical to the GPU modes (CPU vs GPU arithmetic);
//                tested against a tolerance
// Paged miss placement (miss_cost_model, bypass_window; the host path only: device slot
// resolution is off with it): x is read back with the routed ids; resolve_group's rule (on_host,
// shared with the CPU engine) sends each miss of a group to a slot or to the host. The groups'
// slot rows are enqueued as above (copies on `copy`, FFNs on `compute`, nothing waits on the
// host); then the CPU computes the host rows from the pinned store (cpu_expert_kernel, fast by
// default) while the GPU works, and copies them up, each run of consecutive rows in one H2D on
// `compute`, into their fixed eout positions before the combine. Slot rows keep resident's bits;
// host rows are within a tolerance (flagged: counters cpu_misses / bypassed).
struct ExpertDevice {
  const model::ModelParams* params = nullptr;  // device views (resident mode's experts)
  mem::TransferEngine* te = nullptr;           // the CUDA transfer engine
  mem::Stream* compute = nullptr;              // where expert FFNs run (the runner's stream)
  mem::Stream* copy = nullptr;                 // H2D copies of misses / static staging
  std::int64_t max_tokens = 0;                 // the runner's step size
  double pace_gbps = 0;  // the engine's link pacing rate (device slot resolution's copies too)
};

class SlotResolver;

class ExpertExecutor {
 public:
  // shared: the engine's device budget, charged the slot pool or staging bytes (may be null).
  // dev: the CUDA engine's streams and device weights (null: the CPU engine). `params` are the
  // host views either way (the expert store is packed from them).
  static Result<std::unique_ptr<ExpertExecutor>> create(const model::DecoderGeometry& geo,
                                                        const model::ModelParams& params,
                                                        const PagerConfig& pc,
                                                        mem::MemoryBudget* shared = nullptr,
                                                        const ExpertDevice* dev = nullptr);
  ~ExpertExecutor();

  // x: [T, C]; ids: [T, K] distinct per row; eout: [T*K, C].
  Status run(int layer, const float* x, const std::int32_t* ids, std::int64_t T, float* eout);
  // The CUDA engine's run(): device pointers, enqueued on dev->compute. d_act: [T*K, F] scratch.
  // Resident and static modes do not block the host; paged and cpu-experts synchronize compute
  // once (the routed ids), except paged inside a device step (begin_device_step: no host wait).
  // Routed ids outside [0, E) give zero rows (not checked: no sync).
  Status run_device(int layer, const float* d_x, const std::int32_t* d_ids, std::int64_t T,
                    float* d_act, float* d_eout);
  bool on_device() const { return dev_ != nullptr; }
  // run_device never waits on the device: resident or static mode and no access observer (the
  // condition for capturing a step into a CUDA graph, model_runner_cuda.cpp).
  bool runs_without_host() const {
    return (mode_ == ExpertMode::kResident || mode_ == ExpertMode::kStatic) && !access_observer_;
  }
  // Device-side slot resolution (PagerConfig::device_resolve, serve/device_resolver.h), CUDA
  // engine, per step: begin_device_step says whether the step's paged layers resolve on the
  // device (paged mode with a resolver, and in every MoE layer the step's experts fit cap - hot:
  // at most `experts[l]` different ones when given (routed_experts_bound of forced routing),
  // else T*K; the runner asks only for decode steps) and if so uploads stale layer state
  // (compute stream, no wait);
  // run_device then enqueues resolve, miss copy and FFN with no host wait; the runner enqueues
  // enqueue_device_log() at the end of the step and calls finish_device_step() after its sync
  // (the pager replays the logs; returns the bytes the device copied, for the link's counters).
  Result<bool> begin_device_step(std::int64_t T, std::span<const std::int64_t> experts = {});
  Status enqueue_device_log(mem::Stream& stream);
  Result<std::uint64_t> finish_device_step();
  // The step failed before its sync: the device state is unknown, rewritten before the next use.
  void cancel_device_step();
  bool device_resolves() const { return resolver_ != nullptr; }
  // A replayed CUDA graph ran what run_device enqueued while it was captured: adds that capture's
  // counter deltas (the replay makes no host calls).
  void count_replayed(const ExecutorCounters& d);

  // Paged mode: sets the live caps ([L], dense entries ignored); each MoE layer keeps at least
  // top-k slots beside its hot experts. Between steps only. Errors: ExpertPager::resize's.
  Status resize_caps(std::span<const int> caps);
  // Sees every layer's routed ids ([T*K], row-major) before they run (MV-WSA's stack distances).
  void set_access_observer(std::function<void(int, std::span<const std::int32_t>)> fn) {
    access_observer_ = std::move(fn);
  }

  ExpertMode mode() const { return mode_; }
  // Paged miss placement: the CPU rate the cost model uses (PagerConfig::cpu_gflops, or the
  // measured one), and the measurement when PagerConfig::measure_cpu_gflops asked for one.
  double placement_cpu_gflops() const { return placement_.cpu_gflops; }
  const std::optional<CpuExpertRate>& measured_cpu_rate() const { return measured_rate_; }
  // PagerConfig::cpu_expert_kernel with kDefault resolved for this engine (what cpu-experts runs).
  CpuExpertKernel cpu_expert_kernel() const { return cpu_kernel_; }
  DType expert_dtype() const { return expert_dtype_; }
  const ExpertStore* store() const { return store_; }
  ExpertPager* pager() const { return pager_.get(); }
  const ExecutorCounters& counters() const { return counters_; }
  // Device-tier bytes this mode holds (slot pool or staging), and its budget.
  std::size_t device_bytes() const;

 private:
  struct DeviceState;  // expert_executor_cuda.cpp
  ExpertExecutor(const model::DecoderGeometry& geo, const model::ModelParams& params,
                 mem::MemTier tier);  // expert_executor_cuda.cpp (DeviceState is complete there)
  // A group is a list of rows i = t*K + k (a token range's, or an expert group's).
  Status compute_group(int layer, const float* x, const std::int32_t* ids,
                       std::span<const std::int32_t> rows, float* eout);
  // The group's distinct experts and where each one's weights are (ref_of_expert_); paged:
  // acquires them from the pager (the caller releases after computing).
  Status resolve_group(int layer, const std::int32_t* ids, std::span<const std::int32_t> rows);
  // Paged: the step's groups (one token range, or expert groups when one does not fit), each
  // handed to `group(rows, index)`.
  Status for_each_paged_group(
      int layer, const std::int32_t* ids, std::int64_t T,
      const std::function<Status(std::span<const std::int32_t>, int)>& group);
  Status create_device(const ExpertDevice& dev, mem::MemoryBudget* shared);
  // rows: the group's rows; their place in the device row list starts at list_offset (groups of a
  // layer step use disjoint ranges).
  Status device_group(int layer, const float* d_x, const std::int32_t* d_ids,
                      std::span<const std::int32_t> rows, std::int64_t list_offset, int group,
                      float* d_act, float* d_eout);

  model::DecoderGeometry geo_;
  const model::ModelParams& params_;
  ExpertMode mode_ = ExpertMode::kResident;
  DType expert_dtype_ = DType::kF32;  // PagerConfig::expert_dtype
  CpuExpertKernel cpu_kernel_ = CpuExpertKernel::kExact;
  std::unique_ptr<ExpertFfnGrouped> grouped_;  // cpu-experts with kFast only
  std::unique_ptr<ExpertStore> own_store_;     // packed here unless PagerConfig::host_store
  const ExpertStore* store_ = nullptr;         // own_store_ or PagerConfig::host_store
  std::unique_ptr<ExpertPager> pager_;
  mem::MemoryBudget staging_budget_;
  BudgetCharge staging_charge_;  // on the engine's device budget
  mem::Arena staging_;           // static mode: one layer's E blocks
  ExecutorCounters counters_;
  std::function<void(int, std::span<const std::int32_t>)> access_observer_;
  std::unique_ptr<DeviceState> dev_;  // the CUDA engine's buffers and streams; null on the CPU
  std::unique_ptr<SlotResolver> resolver_;  // PagerConfig::device_resolve (paged, LRU / LFU)
  bool device_step_ = false;                // between begin_ and finish_device_step
  // The rows of the whole call (ids [T*K]), their experts' weights through ref_of_expert_.
  void compute_rows(const float* x, const std::int32_t* ids, std::span<const std::int32_t> rows,
                    float* eout);
  // Per-group scratch, sized once: distinct experts and their refs, by expert id.
  std::vector<std::int32_t> distinct_;
  std::vector<std::int32_t> rows_;    // the current group's rows
  std::vector<int> group_of_expert_;  // [E] expert groups of a paged step
  std::vector<bool> resident_;        // [E] scratch: in a slot before the step
  std::vector<ExpertRef> distinct_refs_;
  std::vector<ExpertRef> ref_of_expert_;  // [E]
  // The different experts among ids [n] (n if any is outside [0, E)), through seen_.
  std::int64_t distinct_experts(const std::int32_t* ids, std::int64_t n);
  std::vector<bool> seen_;              // [E] scratch, all false between uses
  std::vector<std::vector<bool>> hot_;  // [L][E] the pager's pinned hot set
  // Miss placement (paged): the config, each layer's step count and each expert's last step.
  PagerConfig placement_;
  std::vector<std::uint64_t> layer_step_;             // [L]
  std::vector<std::vector<std::uint64_t>> last_use_;  // [L][E], 0 = never
  std::vector<std::int32_t> paged_;                   // the group's experts that go to the pager
  std::vector<ExpertRef> paged_refs_;
  std::vector<std::int64_t> rows_of_expert_;  // [E] the group's rows per expert (cost model)
  // The group's pager outcome per distinct expert (-1 hit, else its copy's place in the batch),
  // indexed like paged_, and by copy: which expert it brought in.
  std::vector<int> copy_index_;
  std::vector<std::int32_t> expert_of_copy_;
  std::vector<int> copy_of_expert_;    // [E] for the group's experts: -1 hit, else the copy
  std::vector<std::int64_t> seg_end_;  // device overlap: end of each copy's rows in the list
  // Where a distinct expert of the group runs: false = a slot (hit or admitted miss; an admission
  // into an empty slot decrements `free`), true = computed from the host store.
  bool on_host(int layer, std::int32_t e, int& free);
  bool placement_on() const {
    return mode_ == ExpertMode::kPaged &&
           (placement_.miss_cost_model || placement_.bypass_window > 0);
  }
  std::optional<CpuExpertRate> measured_rate_;
  // [E] resolve_group's choice for the current group's experts (true: from the host store), and
  // the store ref of each host expert of the layer step (an expert is in one group of a step).
  std::vector<bool> host_expert_;
  std::vector<ExpertRef> host_ref_;
  // CUDA paged with placement: the layer step's host rows (all groups), the current group's
  // device rows.
  std::vector<std::int32_t> host_rows_, device_rows_;
  // CUDA: computes host_rows_ on the CPU from the pinned x and copies them into d_eout.
  Status compute_host_rows(float* d_eout);
};

}  // namespace ferry::serve
