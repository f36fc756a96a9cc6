// SPDX-License-Identifier: Apache-2.0
#include "train/stream/stream_executor.h"

#include <cmath>
#include <cstring>

#include "core/timer.h"
#include "mem/stream_set.h"
#include "mem/tier.h"
#include "mem/transfer_engine.h"
#include "model/model_binding.h"
#include "model/param_spec.h"
#include "train/stream/bf16_widen.h"

namespace ferry::train::stream {

namespace {

ConstTensorView view_at(const float* p, const std::vector<std::int64_t>& shape) {
  ConstTensorView v = ConstTensorView::contiguous(p, DType::kF32, Device::kCpu, {1});
  v.ndim = static_cast<int>(shape.size());
  std::int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.stride[d] = stride;
    stride *= shape[d];
  }
  return v;
}

// The executor owns the memory behind these views; it writes gradients through them.
TensorView writable(const ConstTensorView& c) {
  TensorView t;
  t.data = const_cast<void*>(c.data);
  t.dtype = c.dtype;
  t.device = c.device;
  t.ndim = c.ndim;
  t.shape = c.shape;
  t.stride = c.stride;
  return t;
}

model::LayerTensors<TensorView> writable(const model::LayerTensors<ConstTensorView>& l) {
  model::LayerTensors<TensorView> w;
  w.attn_norm = writable(l.attn_norm);
  w.q = writable(l.q);
  w.k = writable(l.k);
  w.v = writable(l.v);
  w.o = writable(l.o);
  w.q_bias = writable(l.q_bias);
  w.k_bias = writable(l.k_bias);
  w.v_bias = writable(l.v_bias);
  w.o_bias = writable(l.o_bias);
  w.q_norm = writable(l.q_norm);
  w.k_norm = writable(l.k_norm);
  w.mlp_norm = writable(l.mlp_norm);
  w.gate = writable(l.gate);
  w.up = writable(l.up);
  w.down = writable(l.down);
  w.router = writable(l.router);
  for (const auto& e : l.expert_gate) w.expert_gate.push_back(writable(e));
  for (const auto& e : l.expert_up) w.expert_up.push_back(writable(e));
  for (const auto& e : l.expert_down) w.expert_down.push_back(writable(e));
  return w;
}

model::ModelGrads writable(const model::ModelParams& p) {
  model::ModelGrads g;
  g.embed = writable(p.embed);
  g.final_norm = writable(p.final_norm);
  g.lm_head = writable(p.lm_head);
  for (const auto& l : p.layers) g.layers.push_back(writable(l));
  return g;
}

// Binds every parameter of the units selected by `want` at `base(unit) + offset`.
template <typename Base>
model::ModelParams bind_views(const std::vector<model::ParamSpec>& specs, const HostArena& arena,
                              const model::DecoderGeometry& geo, bool globals, Base base) {
  model::ModelParams mp;
  for (const ParamLoc& p : arena.params()) {
    const bool is_global = p.unit == arena.globals_unit();
    if (is_global != globals) continue;
    *model::param_slot(mp, specs[static_cast<std::size_t>(p.index)], geo) =
        view_at(base(p.unit) + p.offset, specs[static_cast<std::size_t>(p.index)].shape);
  }
  if (globals && geo.tied_embeddings) mp.lm_head = mp.embed;
  return mp;
}

}  // namespace

Result<std::unique_ptr<StreamExecutor>> StreamExecutor::create(const TrainState& s, int batch,
                                                               std::int64_t seq_len,
                                                               const StreamOptions& opts,
                                                               kernels::Backend& backend) {
  if (backend.device() != Device::kCpu) {
    return unimplemented(
        "train: the stream executor runs CPU kernels only (GPU kernels on the CUDA device tier "
        "are not wired yet)");
  }
  if (opts.prefetch < 1) return invalid_argument("train: --prefetch must be >= 1");
  FERRY_TRY(validate(opts.policy));
  if (opts.policy.layers() != s.geometry.layers) {
    return invalid_argument("train: policy {} has {} boundaries, the model {} layers",
                            opts.policy.name, opts.policy.layers(), s.geometry.layers);
  }
  std::unique_ptr<StreamExecutor> ex(new StreamExecutor(backend, opts));
  ex->geo_ = s.geometry;
  FERRY_ASSIGN_OR_RETURN(ex->arena_, HostArena::create(s));
  const ModelSizes sizes{.globals_elements = ex->arena_->unit_elements(ex->arena_->globals_unit()),
                         .max_layer_elements = ex->arena_->max_layer_elements()};
  FERRY_TRY(check_budget(s.geometry, sizes, opts.policy, opts.prefetch + 1, batch, seq_len,
                         opts.device_budget_bytes, backend));
  FERRY_TRY(ex->init(s, batch * seq_len));
  return ex;
}

Status StreamExecutor::init(const TrainState& s, std::int64_t max_tokens) {
  stats_.window_s.assign(static_cast<std::size_t>(2 * s.geometry.layers + 1), 0.0);
  stats_.window_exposed_s.assign(stats_.window_s.size(), 0.0);
  max_tokens_ = max_tokens;
  sr_seed_ = s.optim.sr_seed;
  const ActivationPolicy& pol = opts_.policy;
  const int L = geo_.layers;
  const ModelSizes sizes{.globals_elements = arena_->unit_elements(arena_->globals_unit()),
                         .max_layer_elements = arena_->max_layer_elements()};
  FERRY_ASSIGN_OR_RETURN(plan_, plan_device(geo_, sizes, pol, opts_.prefetch + 1, max_tokens, be_));
  FERRY_ASSIGN_OR_RETURN(device_, mem::make_arena(plan_.plan, cpu_device_tier(), budget_,
                                                  {.what = "train device tier"}));
  // ModelCompute's buffers are the device-tier workspace of this executor: charged here.
  FERRY_TRY(budget_.reserve(plan_.compute_bytes, "train compute workspace"));
  workspace_charged_ = true;
  FERRY_ASSIGN_OR_RETURN(compute_, model::ModelCompute::create(geo_, max_tokens, be_, 1));

  // Pinned host homes of boundaries, and the NVMe bounce buffer.
  const std::size_t act = static_cast<std::size_t>(max_tokens) * geo_.hidden * sizeof(float);
  mem::ArenaPlan hp;
  host_boundary_.resize(static_cast<std::size_t>(L));
  for (int i = 0; i < L; ++i) {
    if (pol.homes[i] == Home::kHost) {
      host_boundary_[i] = hp.add("host_boundary." + std::to_string(i), act, 4096);
    }
  }
  const int nvme_count = pol.count(Home::kNvme);
  if (nvme_count > 0) {
    FERRY_ASSIGN_OR_RETURN(
        nvme_, mem::NvmeStore::open({.dir = pol.nvme_dir,
                                     .name = "train-acts",
                                     .record_bytes = act,
                                     .capacity_records = static_cast<std::size_t>(nvme_count)},
                                    nvme_budget_));
    nvme_staging_ = hp.add("nvme_staging", nvme_->record_stride(), mem::NvmeStore::kIoAlignBytes);
    nvme_record_.resize(static_cast<std::size_t>(L));
    for (int i = 0; i < L; ++i) {
      if (pol.homes[i] == Home::kNvme) {
        FERRY_ASSIGN_OR_RETURN(nvme_record_[i], nvme_->allocate());
      }
    }
  }
  FERRY_ASSIGN_OR_RETURN(host_acts_, mem::make_arena(hp, cpu_pinned_tier(), host_act_budget_,
                                                     {.what = "train host activations"}));

  FERRY_ASSIGN_OR_RETURN(mem::StreamSet ss, mem::StreamSet::create(Device::kCpu));
  streams_ = std::make_unique<mem::StreamSet>(std::move(ss));
  opt_ = std::make_unique<LayerOptimizer>(*arena_);
  std::vector<float*> slots;
  for (mem::SlotId id : plan_.slots) slots.push_back(dev(id));
  streamer_ =
      std::make_unique<WeightStreamer>(*arena_, *opt_, std::move(slots), weight_schedule(pol),
                                       mem::host_transfer_engine(), streams_->h2d());

  // Views, bound once: no allocation in the step loop.
  const std::vector<model::ParamSpec> specs = model::param_specs(s.config);
  globals_ = bind_views(specs, *arena_, geo_, true,
                        [&](int) -> const float* { return dev(plan_.globals_w); });
  globals_grad_ = writable(bind_views(specs, *arena_, geo_, true,
                                      [&](int) -> const float* { return dev(plan_.globals_g); }));
  for (mem::SlotId id : plan_.slots) {
    slot_params_.push_back(
        bind_views(specs, *arena_, geo_, false, [&](int) -> const float* { return dev(id); }));
  }
  for (mem::SlotId id : plan_.grads) {
    grad_slots_.push_back(writable(
        bind_views(specs, *arena_, geo_, false, [&](int) -> const float* { return dev(id); })));
  }
  std::vector<float*> gslots;
  for (mem::SlotId id : plan_.grads) gslots.push_back(dev(id));
  drain_ =
      std::make_unique<GradDrain>(std::move(gslots), mem::host_transfer_engine(), streams_->d2h());
  spans_ = pol.spans();
  sumsq_.assign(arena_->params().size(), 0.0);
  return {};
}

StreamExecutor::~StreamExecutor() {
  drain_.reset();
  streamer_.reset();
  opt_.reset();
  if (workspace_charged_) budget_.release(plan_.compute_bytes);
}

TensorView StreamExecutor::act_view(float* p, std::int64_t T) const {
  return TensorView::contiguous(p, DType::kF32, Device::kCpu, {T, std::int64_t(geo_.hidden)});
}

Status StreamExecutor::copy(void* dst, const void* src, std::size_t bytes, mem::CopyKind kind,
                            std::uint64_t* counter) {
  Timer t;
  FERRY_TRY(mem::host_transfer_engine().copy(dst, src, bytes, kind, mem::Stream::host()));
  stats_.exposed_s += t.elapsed_s();
  *counter += bytes;
  return {};
}

float* StreamExecutor::boundary_ptr(int i) const {
  if (i == geo_.layers) return dev(plan_.x_final);
  if (opts_.policy.homes[i] == Home::kDevice) return dev(plan_.boundary[i]);
  return dev(plan_.transit[static_cast<std::size_t>(i % 2)]);
}

Status StreamExecutor::store_boundary(int i, const float* x, std::int64_t T) {
  const std::size_t bytes = static_cast<std::size_t>(T) * geo_.hidden * sizeof(float);
  switch (opts_.policy.homes[i]) {
    case Home::kHost:
      return copy(host_acts_.data(host_boundary_[i]), x, bytes, mem::CopyKind::kDeviceToHost,
                  &stats_.act_d2h);
    case Home::kNvme: {
      FERRY_TRY(copy(host_acts_.data(nvme_staging_), x, bytes, mem::CopyKind::kDeviceToHost,
                     &stats_.act_d2h));
      Timer t;
      FERRY_TRY(nvme_->write(nvme_record_[i], host_acts_.data(nvme_staging_)));
      stats_.exposed_s += t.elapsed_s();
      stats_.nvme_write += nvme_->record_stride();
      return {};
    }
    case Home::kDevice:
    case Home::kRecompute:
      return {};
  }
  return {};
}

Result<const float*> StreamExecutor::fetch_boundary(int i, std::int64_t T) {
  const std::size_t bytes = static_cast<std::size_t>(T) * geo_.hidden * sizeof(float);
  switch (opts_.policy.homes[i]) {
    case Home::kDevice:
      return static_cast<const float*>(dev(plan_.boundary[i]));
    case Home::kHost:
      FERRY_TRY(copy(dev(plan_.fetch), host_acts_.data(host_boundary_[i]), bytes,
                     mem::CopyKind::kHostToDevice, &stats_.act_h2d));
      return static_cast<const float*>(dev(plan_.fetch));
    case Home::kNvme: {
      Timer t;
      FERRY_TRY(nvme_->read(nvme_record_[i], host_acts_.data(nvme_staging_)));
      stats_.exposed_s += t.elapsed_s();
      stats_.nvme_read += nvme_->record_stride();
      FERRY_TRY(copy(dev(plan_.fetch), host_acts_.data(nvme_staging_), bytes,
                     mem::CopyKind::kHostToDevice, &stats_.act_h2d));
      return static_cast<const float*>(dev(plan_.fetch));
    }
    case Home::kRecompute:
      break;
  }
  return internal_error("train: boundary {} is recomputed, not fetched", i);
}

// On the device copy of the unit's gradient, right after its backward: the global norm then
// needs no pass over the host arena (the GPU executor runs the same kernel on the GPU).
Status StreamExecutor::take_sumsq(int unit, const float* grads) {
  float part = 0.0f;
  const TensorView out = TensorView::contiguous(&part, DType::kF32, Device::kCpu, {1});
  for (int idx : arena_->unit_params(unit)) {
    const ParamLoc& p = arena_->params()[static_cast<std::size_t>(idx)];
    const ConstTensorView g =
        ConstTensorView::contiguous(grads + p.offset, DType::kF32, Device::kCpu, {p.n});
    FERRY_TRY(be_.sum_squares({.out = out, .x = g}, mem::Stream::host()));
    sumsq_[static_cast<std::size_t>(idx)] = static_cast<double>(part);
  }
  return {};
}

void StreamExecutor::begin_step(int accum) {
  accum_ = accum;
  micro_ = 0;
}

Result<model::ForwardResult> StreamExecutor::micro_batch(const model::PackedBatch& b) {
  const std::int64_t T = b.ids.numel();
  if (T <= 0 || T > max_tokens_) {
    return invalid_argument("train: micro-batch of {} tokens outside [1, {}] planned", T,
                            max_tokens_);
  }
  if (micro_ >= accum_) return invalid_argument("train: more micro-batches than begin_step said");
  const int a = micro_++;
  const bool last = micro_ == accum_;
  const int L = geo_.layers, G = arena_->globals_unit();
  const std::size_t gbytes = static_cast<std::size_t>(arena_->unit_elements(G)) * sizeof(float);
  streamer_->start_micro_batch();
  if (a == 0) {
    Timer t;
    opt_->wait_ready(G);
    stats_.exposed_s += t.elapsed_s();
    if (arena_->bf16_master()) {
      const std::int64_t n = arena_->unit_elements(G);
      FERRY_TRY(copy(bf16_staging(dev(plan_.globals_w), n), arena_->w16(G),
                     arena_->unit_weight_bytes(G), mem::CopyKind::kHostToDevice,
                     &stats_.globals_h2d));
      widen_bf16_in_place(dev(plan_.globals_w), n);
    } else {
      FERRY_TRY(copy(dev(plan_.globals_w), arena_->weights(G), gbytes, mem::CopyKind::kHostToDevice,
                     &stats_.globals_h2d));
    }
    std::memset(dev(plan_.globals_g), 0, gbytes);
  }
  // Forward.
  FERRY_TRY(compute_->embed(globals_.embed, b, act_view(boundary_ptr(0), T)));
  FERRY_TRY(store_boundary(0, boundary_ptr(0), T));
  int j = 0;
  for (int l = 0; l < L; ++l) {
    window_begin(l);
    FERRY_ASSIGN_OR_RETURN(const int slot, streamer_->acquire(j, &stats_.exposed_s));
    ++stats_.layer_forwards;
    FERRY_TRY(compute_->layer_forward(l, slot_params_[slot].layers[l], b,
                                      act_view(boundary_ptr(l), T),
                                      act_view(boundary_ptr(l + 1), T)));
    streamer_->release(j++);
    if (l + 1 < L) FERRY_TRY(store_boundary(l + 1, boundary_ptr(l + 1), T));
    window_end();
  }
  window_begin(L);
  const ConstTensorView x_final = act_view(dev(plan_.x_final), T);
  FERRY_ASSIGN_OR_RETURN(const model::ForwardResult r,
                         compute_->head_forward(globals_.final_norm, globals_.lm_head, b, x_final));
  FERRY_TRY(compute_->head_backward(globals_.final_norm, globals_.lm_head, globals_grad_.final_norm,
                                    globals_grad_.lm_head, b, x_final));
  window_end();
  // Backward, span by span from the top.
  for (auto it = spans_.rbegin(); it != spans_.rend(); ++it) {
    const int s = it->start, e = it->end;
    window_begin(2 * L - (e - 1));  // the span's fetch and recompute run in the top layer's window
    FERRY_ASSIGN_OR_RETURN(const float* xs, fetch_boundary(s, T));
    auto input_of = [&](int l) -> const float* {
      return l == s ? xs : dev(plan_.recompute[static_cast<std::size_t>(l - s - 1)]);
    };
    for (int l = s; l <= e - 2; ++l) {  // regenerate boundaries s+1 .. e-1
      FERRY_ASSIGN_OR_RETURN(const int slot, streamer_->acquire(j, &stats_.exposed_s));
      ++stats_.layer_forwards;
      FERRY_TRY(compute_->layer_forward(
          l, slot_params_[slot].layers[l], b, act_view(const_cast<float*>(input_of(l)), T),
          act_view(dev(plan_.recompute[static_cast<std::size_t>(l - s)]), T)));
      streamer_->release(j++);
    }
    for (int l = e - 1; l >= s; --l) {
      if (l != e - 1) window_begin(2 * L - l);
      FERRY_ASSIGN_OR_RETURN(const int slot, streamer_->acquire(j, &stats_.exposed_s));
      const model::LayerTensors<ConstTensorView>& p = slot_params_[slot].layers[l];
      const TensorView x_in = act_view(const_cast<float*>(input_of(l)), T);
      // The layer's internals, from its input (the output is not needed again).
      ++stats_.layer_forwards;
      FERRY_TRY(compute_->layer_forward(l, p, b, x_in, act_view(dev(plan_.transit[0]), T)));
      const std::size_t lbytes = static_cast<std::size_t>(arena_->unit_elements(l)) * sizeof(float);
      const int gk = drain_->acquire(&stats_.exposed_s);
      float* gslot = dev(plan_.grads[static_cast<std::size_t>(gk)]);
      if (a == 0) {
        std::memset(gslot, 0, lbytes);
      } else {
        FERRY_TRY(
            copy(gslot, arena_->grads(l), lbytes, mem::CopyKind::kHostToDevice, &stats_.grad_h2d));
      }
      ++stats_.layer_backwards;
      FERRY_TRY(compute_->layer_backward(l, p, grad_slots_[gk].layers[l], b, x_in));
      streamer_->release(j++);
      if (last) FERRY_TRY(take_sumsq(l, gslot));
      drain_->submit(arena_->grads(l), lbytes);
      window_end();
    }
  }
  FERRY_TRY(compute_->embed_backward(globals_grad_.embed, b));
  FERRY_TRY(streamer_->finish());
  // The next micro-batch reads these gradients back (or the optimizer does).
  FERRY_TRY(drain_->flush(&stats_.exposed_s));
  if (last) {
    FERRY_TRY(take_sumsq(G, dev(plan_.globals_g)));
    FERRY_TRY(copy(arena_->grads(G), dev(plan_.globals_g), gbytes, mem::CopyKind::kDeviceToHost,
                   &globals_grad_d2h_));
  }
  stats_.weight_h2d = streamer_->h2d_bytes();
  stats_.grad_d2h = drain_->bytes() + globals_grad_d2h_;
  return r;
}

void StreamExecutor::window_begin(int t) {
  window_ = t;
  window_timer_.reset();
  window_exposed_at_ = stats_.exposed_s;
}

void StreamExecutor::window_end() {
  const auto t = static_cast<std::size_t>(window_);
  stats_.window_s[t] += window_timer_.elapsed_s();
  stats_.window_exposed_s[t] += stats_.exposed_s - window_exposed_at_;
  window_ = -1;
}

Result<StepOutcome> StreamExecutor::finish_step(const AdamWConfig& cfg, double lr,
                                                std::int64_t opt_step) {
  if (micro_ != accum_) {
    return invalid_argument("train: finish_step after {} of {} micro-batches", micro_, accum_);
  }
  StepOutcome o;
  const ClipResult clip = clip_from_partials(sumsq_, accum_, cfg.max_grad_norm);
  o.grad_norm = clip.norm;
  if (!std::isfinite(o.grad_norm)) return o;
  o.clip = clip.clip;
  if (!(cfg.beta1 >= 0.0 && cfg.beta1 < 1.0) || !(cfg.beta2 >= 0.0 && cfg.beta2 < 1.0)) {
    return invalid_argument("train: betas ({}, {}) must lie in [0, 1)", cfg.beta1, cfg.beta2);
  }
  if (opt_step < 1) return invalid_argument("train: AdamW step {} < 1", opt_step);
  opt_->submit({.lr = static_cast<float>(lr),
                .beta1 = static_cast<float>(cfg.beta1),
                .beta2 = static_cast<float>(cfg.beta2),
                .eps = static_cast<float>(cfg.eps),
                .weight_decay = static_cast<float>(cfg.weight_decay),
                .grad_scale = static_cast<float>(o.clip / static_cast<double>(accum_)),
                .step = opt_step,
                .sr_seed = sr_seed_});
  o.applied = true;
  return o;
}

Status StreamExecutor::store_to(TrainState& s) {
  opt_->wait_all();
  return arena_->store_to(s);
}

Status StreamExecutor::load_from(const TrainState& s) {
  opt_->wait_all();
  return arena_->load_from(s);
}

}  // namespace ferry::train::stream
