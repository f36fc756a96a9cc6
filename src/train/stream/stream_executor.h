// SPDX-License-Identifier: Apache-2.0
// StreamExecutor: the layer-streaming training executor over the device tier (emulated by host
// memory in CPU builds, with a hard byte budget). Model state lives in the HostArena; per
// micro-batch the device holds only what DevicePlan lists. One step:
//
//   begin_step(accum)
//   micro_batch(b) x accum:
//     [a == 0: wait for the embedding's update, copy it in, zero the head's gradients]
//     forward   embed; layer 0..L-1 on weights streamed into the slot ring by the transfer
//               thread (WeightStreamer); each produced boundary goes to its home (device buffer,
//               D2H to pinned host, or D2H + NVMe write; recomputed ones are dropped)
//               [a == 0: once the head's update (final norm + lm_head) is ready — polled after
//               each layer — its weights go up on the head stream; before the loss compute
//               waits for them, then zeroes the embedding's gradients]
//     loss      final norm + chunked cross-entropy, then its backward
//     backward  per span (s, e) from the top: bring boundary s back, recompute layers s..e-2 on
//               re-streamed weights, then for l = e-1..s: re-run layer l's forward from its input
//               (internals; skipped for a kept layer, whose forward left them in a workspace
//               of its own: ActivationPolicy::keep) — meanwhile a gradient slot is filled
//               (zero on the first micro-batch, else the host's accumulated gradient, copied on
//               a refill stream of its own beside the internals) — backward; on the last
//               micro-batch take each
//               parameter's sum of squares on the device slot; GradDrain copies the slot to the
//               host arena on its own thread while compute moves on to the next layer
//     embed backward; [last: drain the globals' gradients, their sums of squares]
//   finish_step(lr, step): ||G|| from the per-parameter sums (in parameter order, as the
//     in-memory executor) -> clip -> LayerOptimizer::submit (CPU worker, layer order) and, with
//     --device-update-layers, DeviceOptimizerTail::submit (its thread claims layers from the
//     bottom, up to --device-update-slots in flight, the CPU worker from the top); returns at
//     once. Non-finite ||G||: nothing is
//     submitted (the caller counts skips). A failed device unit surfaces as the Status of the
//     next micro_batch / finish_step / store_to.
//
// GPU-resident layers (--resident-layers K, resident_layers.h): layers 0..K-1 leave the weight
// schedule (forward, recompute and backward read their resident weights in place), the backward
// accumulates their gradients in place (no drain, no refill; their sums of squares as for the
// others), and finish_step enqueues their update on the compute stream right after the CPU
// worker's and the tail's submit; store_to / release_arena copy their state back to the arena,
// load_from takes it up again. The tail and the CPU worker share only layers K..L-1.
// bf16 gradients (TrainState::bf16_grads): after each layer's backward the f32 slot is rounded
// to bf16 into its twin (grad16), which drains (half the D2H) into the arena's bf16 gradients;
// later micro-batches refill the twin and widen it into the slot on the refill stream; the
// globals' running sum is rounded in place each micro-batch; the last micro-batch's norm is taken
// on the rounded values, which the optimizer widens back — the in-memory executor's
// round_grads_to_bf16() after every micro-batch, so the bits still match.
// Bit-identical to the in-memory executor (trainer.h) for every policy on the CPU backend: the
// same kernels run on the same values in the same order; recompute is deterministic.
// bf16 masters: the arena's bf16 weights stream as bf16 (half the link bytes) and are widened on
// the device tier (bf16_widen.h: in place on the emulated tier, from a staging buffer on a GPU),
// or on a GPU with bf16 GEMMs land in each slot's bf16 twin, read in place by the GEMMs (bf16
// weight views; only norms, biases and the router are widened).
//
// On a CUDA backend the same code runs on the GPU (docs/train_gpu_executor.md): the device tier is
// cudaMalloc'd memory under the same budget, the host arena and boundary homes are pinned, the
// compute thread enqueues every kernel and copy on the compute stream of a StreamSet, the weight
// ring is fed on the h2d stream and gradients leave on the d2h stream, ordered by events (a slot
// is refilled only after the kernels that read it ran; a gradient leaves only after the kernels
// that wrote it ran). The batch is copied into the device tier; the per-parameter sums of squares
// stay on the device until the step's last micro-batch reads them back (P floats). Exposed time
// is GPU time from events (exposure_clock.h), not host time. The host syncs of a micro-batch:
// ModelCompute's few reads (loss, MoE offsets), NVMe staging, and its end.
// Boundary offload overlaps compute: stores leave on an activation d2h stream once compute has
// written the boundary (its transit buffer is reused two layers later, after the copy), and
// backward's fetches run one span ahead on an activation h2d stream into two buffers (the fetch
// buffer and transit.1, which backward does not otherwise use: its re-forwards write no output),
// the first during the loss. An
// H200 run with every boundary in host memory showed 6-9 ms per window exposed while these
// copies sat on the compute stream.
// Tests: tests/unit/train/stream_executor_test.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/result.h"
#include "core/timer.h"
#include "kernels/backend.h"
#include "mem/budget.h"
#include "mem/event.h"
#include "mem/nvme_store.h"
#include "mem/stream_set.h"
#include "mem/transfer_engine.h"
#include "model/model_compute.h"
#include "train/optimizer.h"
#include "train/stream/activation_policy.h"
#include "train/stream/bf16_widen.h"
#include "train/stream/cpu_tiers.h"
#include "train/stream/device_optimizer_tail.h"
#include "train/stream/device_plan.h"
#include "train/stream/exposure_clock.h"
#include "train/stream/grad_drain.h"
#include "train/stream/host_arena.h"
#include "train/stream/layer_optimizer.h"
#include "train/stream/nvme_read_ahead.h"
#include "train/stream/resident_layers.h"
#include "train/stream/weight_streamer.h"
#include "train/train_state.h"

namespace ferry::train::stream {

struct StreamOptions {
  ActivationPolicy policy;
  int prefetch = 2;  // weight slots beyond the one in use (ring = prefetch + 1, >= 2)
  std::size_t device_budget_bytes = mem::MemoryBudget::kUnlimited;
  // CPU threads of the AdamW update (LayerOptimizer). 0: one beside CPU compute (whose kernels
  // use every core), all cores but two beside GPU compute (the compute and transfer threads).
  int optimizer_threads = 0;
  // How ModelCompute's linear layers multiply (model_compute.h): kBf16 runs the GEMMs on bf16
  // tensor cores (f32 accumulation); kF32 is the reference arithmetic.
  model::GemmPrecision gemm_precision = model::GemmPrecision::kF32;
  // The most layers the device updates in the optimizer phase (device_optimizer_tail.h): it
  // claims 0, 1, ... on a thread of its own while the CPU worker, after the globals, claims
  // L-1, L-2, ... until they meet. 0: the CPU updates every unit (globals, then 0..L-1);
  // kDeviceUpdateAllLayers: every layer may go to the device (the meeting point decides).
  int device_update_layers = 0;
  // The device tail's staging slots: units in flight at once, so that one unit's H2D overlaps
  // the previous unit's kernels and D2H (the device tier holds slots x the largest layer's
  // optimizer sections). 1: one unit at a time.
  int device_update_slots = 2;
  // GPU-resident layers (resident_layers.h): layers 0..K-1 keep weights, master, states and
  // gradients in the device tier for the whole run and are updated there in place (no weight
  // streaming, no gradient D2H, no CPU optimizer work for them). 0: none (today's behaviour);
  // kResidentAllLayers: every layer; kResidentAuto: the most that fit the budget at this batch.
  // With device_update_layers the tail takes only layers K.. (its count is of those).
  int resident_layers = 0;
  // Where the CPU worker updates the final norm + lm_head (layer_optimizer.h): the forward waits
  // for them only at the head, for the embedding before its first layer.
  HeadUpdate head_update = HeadUpdate::kEarly;
  // The device tail pre-stages its first layers' states (all but the gradients) into its staging
  // slots during the last micro-batch's backward (DeviceOptimizerTail::prestage).
  bool device_update_prestage = true;
  // bf16 weight views (bf16_widen.h, docs/train_gpu_executor.md): with bf16 streaming weights and
  // bf16 GEMMs on a GPU, each weight slot gets a bf16 twin the layer lands in and the GEMMs read in
  // place (no per-GEMM weight convert); only the parameters read as f32 are widened. Same bits as
  // the converting path. Default on unless FERRY_BF16_WEIGHT_VIEWS=0; no effect elsewhere.
  bool bf16_weight_views = bf16_weight_views_default();
  // Tests only (off by default): called before each unit's update on the CPU worker / on the
  // device tail's thread (a non-OK Status fails the tail's unit) — delays and failures.
  std::function<void(int unit)> cpu_update_hook;
  std::function<Status(int unit)> device_update_hook;
  std::function<Status(int unit)> device_prestage_hook;  // before each unit's pre-staging
};

// Bytes moved and time exposed, cumulative since create().
struct TransferStats {
  std::uint64_t weight_h2d = 0;   // layer weights into slots (forward, recompute, backward)
  std::uint64_t globals_h2d = 0;  // embedding / final norm / lm_head weights, once per step
  std::uint64_t grad_d2h = 0;     // layer + globals gradients out
  std::uint64_t grad_h2d = 0;     // accumulated layer gradients back in (micro-batch > 0)
  std::uint64_t act_d2h = 0;      // boundaries to host / NVMe staging
  std::uint64_t act_h2d = 0;      // boundaries back
  std::uint64_t nvme_write = 0, nvme_read = 0;
  // Host wall time inside the disk calls alone (NvmeStore::write / read of a whole record, not
  // the staging copy's wait before them): the rate the executor got from its disk, to set beside
  // the machine profile's nvme_write_gbps / nvme_read_gbps.
  double nvme_write_s = 0.0, nvme_read_s = 0.0;
  // Compute waiting on copies or weight slots (exposure_clock.h): host time on the CPU backend,
  // the GPU's idle / copy time from events on a GPU.
  double exposed_s = 0.0;
  // Work, for the FLOP count (step_flops.h): layer passes run, recomputes included.
  std::uint64_t layer_forwards = 0, layer_backwards = 0;
  // Of layer_forwards, the re-forwards right before a layer's backward: internals only
  // (ModelCompute::layer_forward_internals: no down projection / combine, no residual add).
  std::uint64_t internals_forwards = 0;
  // Layer backwards that read the internals their forward kept (ActivationPolicy::keep) instead
  // of re-running the forward: per micro-batch the policy's kept count, and layer_forwards is
  // that much lower than without the keeps.
  std::uint64_t kept_layers = 0;
  // Per compute window of the plan's numbering ([2L+1]: forward of layer j = j, loss = L,
  // backward of layer j = 2L - j, its span's recompute included): wall time spent in the window
  // and the part of it the compute thread was blocked on copies (plan/problem.h). The embedding,
  // the globals' copies and the final gradient flush belong to no window (the plan's fixed part).
  std::vector<double> window_s, window_exposed_s;
};

// The arena's sizes as the device plan counts them.
ModelSizes model_sizes(const HostArena& arena);
// The same from the model's config, without an arena (`ferry plan` sizing the executor's GPU
// memory): bf16_weights as the arena would be created (HostArena::bf16_weights()).
ModelSizes model_sizes(const model::ModelConfig& config, bool bf16_weights,
                       bool bf16_grads = false);

class StreamExecutor {
 public:
  // Builds the host arena from `s` (weights, states), plans the device tier for micro-batches
  // of up to max_tokens = batch * seq_len and refuses it (check_budget's message) when it does
  // not fit the budget.
  static Result<std::unique_ptr<StreamExecutor>> create(const TrainState& s, int batch,
                                                        std::int64_t seq_len,
                                                        const StreamOptions& opts,
                                                        kernels::Backend& backend);
  // The same over an arena built without a TrainState (HostArena::create_initialized, created
  // in host_tier(backend)); sr_seed keys bf16-sr's rounding. store_to / load_from then need a
  // TrainState of the arena's layout.
  static Result<std::unique_ptr<StreamExecutor>> create(
      std::unique_ptr<HostArena> arena, const model::ModelConfig& config, std::uint64_t sr_seed,
      int batch, std::int64_t seq_len, const StreamOptions& opts, kernels::Backend& backend);
  // Where the host arena lives for this backend: pinned (cudaHostAlloc) beside a GPU.
  static mem::MemTier host_tier(const kernels::Backend& backend);
  // Ends `ex` (its pending update and GPU work finish first) and hands its host arena back, for
  // another executor (HostArena::reinitialize to start over).
  static std::unique_ptr<HostArena> release_arena(std::unique_ptr<StreamExecutor> ex);
  ~StreamExecutor();

  void begin_step(int accum);
  Result<model::ForwardResult> micro_batch(const model::PackedBatch& batch);
  Result<StepOutcome> finish_step(const AdamWConfig& cfg, double lr, std::int64_t opt_step);

  // Waits for the pending update (its weights and states are then final in the arena).
  void wait_optimizer();
  // Waits for the pending update, then copies master + states into / from `s`.
  Status store_to(TrainState& s);
  Status load_from(const TrainState& s);

  const TransferStats& stats() const { return stats_; }
  std::size_t device_peak_bytes() const { return budget_.bytes_peak(); }
  std::size_t device_planned_bytes() const { return plan_.total_bytes(); }
  // Of that, the kept layers' internals (ModelCompute::kept_layer_bytes per kept layer).
  std::size_t device_kept_bytes() const { return plan_.kept_bytes; }
  const HostArena& arena() const { return *arena_; }
  double optimizer_busy_s() const { return opt_->busy_s(); }
  // Per arena unit (layers 0..L-1, then the globals), cumulative.
  std::vector<double> optimizer_unit_busy_s() const { return opt_->unit_busy_s(); }
  // The globals' entry of that split: {embedding, final norm + lm_head}.
  std::array<double, 2> optimizer_globals_busy_s() const { return opt_->globals_busy_s(); }
  // The device optimizer tail's counters (all zero with device_update_layers = 0); consistent
  // once wait_optimizer() returned.
  DeviceTailStats device_tail_stats() const { return tail_ ? tail_->stats() : DeviceTailStats{}; }
  // GPU-resident layers (StreamOptions::resident_layers, resolved) and their counters.
  int resident_layers() const { return resident_ ? resident_->count() : 0; }
  ResidentStats resident_stats() const { return resident_ ? resident_->stats() : ResidentStats{}; }
  // Of device_planned_bytes(), the resident layers' (ResidentLayers::bytes).
  std::size_t device_resident_bytes() const { return plan_.plan.slot(plan_.resident).size_bytes; }
  // Whether the layer GEMM weights are read as bf16 views of the slots' twins (the plan's
  // decision: StreamOptions::bf16_weight_views where it applies).
  bool bf16_weight_views() const { return plan_.bf16_weight_views; }
  // Layer GEMMs whose weight ModelCompute converted to bf16 since create() (0 with bf16 weight
  // views; > 0 on the converting path with bf16 GEMMs).
  std::uint64_t gemm_weight_converts() const { return compute_->gemm_weight_converts(); }
  // ModelCompute's GEMM input reuse (FERRY_GEMM_INPUT_REUSE, model::gemm_input_reuse_default())
  // and the layer GEMM input activations it rounded to bf16 by a separate convert since create().
  bool gemm_input_reuse() const { return compute_->gemm_input_reuse(); }
  std::uint64_t gemm_input_converts() const { return compute_->gemm_input_converts(); }
  // ModelCompute::layer_forward_internals calls since create(): the backward's re-forwards (for
  // tests: equal to stats().internals_forwards).
  std::uint64_t compute_internals_forwards() const { return compute_->internals_forwards(); }

 private:
  StreamExecutor(kernels::Backend& be, const StreamOptions& opts);
  Status init(const model::ModelConfig& config, std::uint64_t sr_seed, std::int64_t max_tokens);
  float* dev(mem::SlotId id) const { return device_.as<float>(id); }
  TensorView act_view(float* p, std::int64_t T) const;
  Status copy(void* dst, const void* src, std::size_t bytes, mem::CopyKind kind,
              std::uint64_t* counter);
  float* boundary_ptr(int i) const;  // where boundary i lives during forward
  Status store_boundary(int i, const float* x, std::int64_t T);
  // Compute waits until transit buffer k's last store has left (before overwriting it).
  Status wait_transit_stored(int k);
  // Backward's boundary fetches, one span ahead on the activation h2d stream into two buffers
  // (the fetch buffer and transit.1, free in backward): issue_fetch starts the next offloaded
  // span's copy once its buffer's last reader is queued; take_fetch makes compute wait for it.
  Status issue_fetch(std::int64_t T);
  Result<const float*> take_fetch();
  Status fetch_into(int buf, int i, std::int64_t T);
  bool offloaded(int i) const;
  TensorView flat(void* p, DType t, std::int64_t n) const;
  Status round_to_bf16(float* f32, void* b16, std::int64_t n, bool back);
  // The globals' head part (final norm + lm_head) into the device globals on the head stream,
  // ending in head_landed_ (micro_batch says when).
  Status land_head();
  Status take_sumsq(int unit, const float* grads);
  Status read_sumsq();
  mem::Stream& cs() { return streams_->compute(); }
  mem::Stream& refill() { return refill_streams_->h2d(); }
  template <typename F>
  auto timed_wait(F&& what) -> decltype(what());
  Result<int> acquire_weights(int j);
  // Layer l's weights for schedule item j: a resident layer's in place (slot -1: nothing
  // acquired), else the weight ring's slot; release_weights releases (and advances j) only a
  // streamed one.
  struct LayerWeights {
    const model::LayerTensors<ConstTensorView>* params = nullptr;
    int slot = -1;
  };
  Result<LayerWeights> layer_weights(int l, int j);
  void release_weights(const LayerWeights& w, int& j);
  Status resident_backward(int l, const model::LayerTensors<ConstTensorView>& p,
                           const model::PackedBatch& b, const TensorView& x_in, int a, bool last);
  // Layer l's internals for its backward: kept ones are still in their workspace from this
  // micro-batch's forward (or its span's recompute); the others are re-run from the layer's input
  // without the output (not needed again): no down projection, no residual add. Counted.
  Status internals_for_backward(int l, const model::LayerTensors<ConstTensorView>& p,
                                const model::PackedBatch& b, const TensorView& x_in);
  // The batch as the backend reads it: `b` itself on the CPU, a copy in the device tier on a GPU.
  Result<model::PackedBatch> device_batch(const model::PackedBatch& b);

  kernels::Backend& be_;
  StreamOptions opts_;
  model::DecoderGeometry geo_;
  mem::MemoryBudget budget_;
  mem::MemoryBudget host_act_budget_;
  mem::MemoryBudget nvme_budget_{mem::MemTier::kNvme};
  std::unique_ptr<HostArena> arena_;
  DevicePlan plan_;
  mem::Arena device_;
  mem::Arena host_acts_;                    // pinned: host-homed boundaries + NVMe staging
  std::vector<mem::SlotId> host_boundary_;  // [L]
  // The NVMe staging buffer (the plan's bounce buffer): stores (the forward) and fetches read ahead
  // (nvme_read_ahead.h, the backward).
  mem::SlotId nvme_staging_;
  std::unique_ptr<mem::NvmeStore> nvme_;
  std::vector<mem::RecordId> nvme_record_;         // [L]
  std::vector<mem::RecordId> nvme_fetch_records_;  // the NVMe ones of fetch_order_, in order
  std::unique_ptr<NvmeReadAhead> read_ahead_;
  int nvme_fetches_taken_ = 0;
  std::unique_ptr<model::ModelCompute> compute_;
  std::unique_ptr<mem::StreamSet> streams_;
  // Accumulated gradients' refill (micro-batches after the first): a stream of its own, so the
  // copy runs beside the layer's recomputed internals, and the event compute waits on.
  std::unique_ptr<mem::StreamSet> refill_streams_;
  std::unique_ptr<mem::Event> refill_ready_;
  // Boundary stores (d2h) and fetches (h2d) on streams of their own, beside the weights' h2d
  // and the gradients' d2h, so compute never waits for an activation copy it does not need yet.
  std::unique_ptr<mem::StreamSet> act_streams_;
  mem::Stream& act_d2h() { return act_streams_->d2h(); }
  mem::Stream& act_h2d() { return act_streams_->h2d(); }
  std::unique_ptr<mem::Event> produced_;                // compute: the boundary to store is written
  std::array<std::unique_ptr<mem::Event>, 2> stored_;   // [transit k]: its last store has left
  std::array<float*, 2> fetch_buf_{};                   // fetch, transit.1
  std::array<std::unique_ptr<mem::Event>, 2> fetched_;  // [buf]: its fetch has landed
  std::array<std::unique_ptr<mem::Event>, 2> buf_free_;  // [buf]: its last reader is queued
  std::unique_ptr<mem::Event> staging_free_;  // the h2d out of the NVMe staging buffer is done
  std::vector<int> fetch_order_;              // boundaries fetched in one backward, in order
  int fetches_issued_ = 0, fetches_taken_ = 0;
  std::unique_ptr<mem::TransferEngine> own_te_;  // the CUDA engine (GPU compute)
  mem::TransferEngine* te_ = nullptr;            // own_te_ or the host engine
  std::unique_ptr<ExposureClock> clock_;
  std::unique_ptr<LayerOptimizer> opt_;
  std::unique_ptr<mem::StreamSet> tail_streams_;  // the tail's own h2d, compute and d2h streams
  std::unique_ptr<DeviceOptimizerTail> tail_;     // device_update_layers != 0
  std::unique_ptr<ResidentLayers> resident_;      // resident_layers != 0
  // Layers 0..K-1 bound to their resident weights / gradients (the other layers' entries unused).
  model::ModelParams resident_params_;
  model::ModelGrads resident_grads_;
  std::unique_ptr<Bf16Landing> landing_;
  std::unique_ptr<Bf16ViewLanding> view_landing_;  // plan_.bf16_weight_views
  // The head part of the globals lands on a stream of its own (head_streams_->h2d()) during the
  // forward, with bf16 weights through the embedding's gradient region as staging (first written
  // by the embedding's backward; zeroed after the landing), and compute waits for head_landed_
  // before the head.
  std::unique_ptr<mem::StreamSet> head_streams_;
  std::unique_ptr<mem::Event> head_landed_;
  std::unique_ptr<Bf16Landing> head_landing_;
  bool head_pending_ = false;  // this step's head update not yet issued to the device
  std::unique_ptr<WeightStreamer> streamer_;
  std::unique_ptr<GradDrain> drain_;

  model::ModelParams globals_;  // device globals (embed, final_norm, lm_head)
  model::ModelGrads globals_grad_;
  std::vector<model::ModelParams> slot_params_;  // [slot]: every layer bound to that slot
  std::vector<model::ModelGrads> grad_slots_;    // [grad slot]: every layer bound to it
  std::uint64_t globals_grad_d2h_ = 0;
  std::vector<double> sumsq_;     // [param] of the step's gradient
  std::vector<float> sumsq_f32_;  // [param] host copy of the device's sums
  std::vector<Span> spans_;
  std::uint64_t sr_seed_ = 0;
  bool workspace_charged_ = false;
  std::int64_t max_tokens_ = 0;
  int accum_ = 1, micro_ = 0;
  TransferStats stats_;
};

}  // namespace ferry::train::stream
