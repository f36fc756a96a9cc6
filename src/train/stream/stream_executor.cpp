// SPDX-License-Identifier: Apache-2.0
#include "train/stream/stream_executor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "core/timer.h"
#include "mem/stream_set.h"
#include "mem/tier.h"
#include "mem/transfer_engine.h"
#include "model/model_binding.h"
#include "model/param_spec.h"

namespace ferry::train::stream {

namespace {

ConstTensorView view_at(const void* p, const std::vector<std::int64_t>& shape, Device device,
                        DType dtype = DType::kF32) {
  ConstTensorView v = ConstTensorView::contiguous(p, dtype, device, {1});
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
  return model::map_layer<TensorView>(l, [](const ConstTensorView& c) { return writable(c); });
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
                              const model::DecoderGeometry& geo, bool globals, Device device,
                              Base base) {
  model::ModelParams mp;
  for (const ParamLoc& p : arena.params()) {
    const bool is_global = p.unit == arena.globals_unit();
    if (is_global != globals) continue;
    *model::param_slot(mp, specs[static_cast<std::size_t>(p.index)], geo) =
        view_at(base(p.unit) + p.offset, specs[static_cast<std::size_t>(p.index)].shape, device);
  }
  if (globals && geo.tied_embeddings) mp.lm_head = mp.embed;
  return mp;
}

// The device tier and the host tier of boundaries / the arena, by where compute runs.
mem::MemTier device_tier_for(const kernels::Backend& be) {
  return be.device() == Device::kCpu ? cpu_device_tier() : mem::MemTier::kDevice;
}
mem::MemTier pinned_tier_for(const kernels::Backend& be) {
  return be.device() == Device::kCpu ? cpu_pinned_tier() : mem::MemTier::kPinnedHost;
}

// The arena's sizes with the executor's choice of bf16 weight views and `resident` GPU-resident
// layers (resolved; their w32 is the f32 part only where bf16 weight views apply).
ModelSizes executor_sizes(const HostArena& arena, const StreamOptions& opts,
                          const kernels::Backend& backend, int resident) {
  ModelSizes sizes = model_sizes(arena);
  sizes.bf16_weight_views = opts.bf16_weight_views;
  sizes.resident_bytes = ResidentLayers::bytes(
      arena, resident, bf16_weight_views(sizes, backend, opts.gemm_precision));
  return sizes;
}

// The whole device plan's bytes with `resident` layers and the tail's staging for the rest.
Result<std::size_t> planned_total(const HostArena& arena, const model::DecoderGeometry& geo,
                                  const StreamOptions& opts, int batch, std::int64_t seq_len,
                                  kernels::Backend& backend, int resident) {
  ModelSizes sizes = executor_sizes(arena, opts, backend, resident);
  const int tail = DeviceOptimizerTail::resolve_units(arena, opts.device_update_layers, resident);
  sizes.optimizer_tail_bytes =
      tail > 0 ? DeviceOptimizerTail::staging_bytes(arena, tail, opts.device_update_slots, resident)
               : 0;
  FERRY_ASSIGN_OR_RETURN(const DevicePlan d,
                         plan_device(geo, sizes, opts.policy, opts.prefetch + 1, batch * seq_len,
                                     backend, opts.gemm_precision));
  return d.total_bytes();
}

// The most resident layers (<= most) whose plan fits the budget at this batch; -1 when not even 0.
Result<int> most_resident(const HostArena& arena, const model::DecoderGeometry& geo,
                          const StreamOptions& opts, int batch, std::int64_t seq_len,
                          kernels::Backend& backend, int most) {
  for (int k = most; k >= 0; --k) {
    // A tail count given as a number may exceed the layers left above k: not a candidate.
    if (opts.device_update_layers > geo.layers - k) continue;
    FERRY_ASSIGN_OR_RETURN(const std::size_t n,
                           planned_total(arena, geo, opts, batch, seq_len, backend, k));
    if (n <= opts.device_budget_bytes) return k;
  }
  return -1;
}

// --resident-layers K on top of a plan that fits without it: refused when the resident layers do
// not fit, naming the largest K that does at this batch.
Status check_resident_budget(const HostArena& arena, const model::DecoderGeometry& geo,
                             const StreamOptions& opts, int batch, std::int64_t seq_len,
                             kernels::Backend& backend) {
  const int K = opts.resident_layers;
  FERRY_ASSIGN_OR_RETURN(const std::size_t need,
                         planned_total(arena, geo, opts, batch, seq_len, backend, K));
  if (need <= opts.device_budget_bytes) return {};
  FERRY_ASSIGN_OR_RETURN(const int best,
                         most_resident(arena, geo, opts, batch, seq_len, backend, K - 1));
  const ModelSizes sizes = executor_sizes(arena, opts, backend, K);
  return resource_exhausted(
      "train: --resident-layers {} needs {} of device tier for the resident layers (their "
      "weights, master, optimizer states and gradients); with it batch {} needs {}, the budget is "
      "{}: {}; or lower the batch or raise --device-budget-mib",
      K, mem::format_bytes(sizes.resident_bytes), batch, mem::format_bytes(need),
      mem::format_bytes(opts.device_budget_bytes),
      best > 0 ? fmt::format("the largest --resident-layers that fits at this batch is {}", best)
               : std::string("not even --resident-layers 1 fits at this batch"));
}

// The device tail's staging (slots x the largest layer's optimizer sections, plus the widening
// buffer) on top of a plan that fits without it: refused when the sum is over the budget, naming
// the most slots, or else the most layers, that would fit.
Status check_tail_budget(const HostArena& arena, const model::DecoderGeometry& geo,
                         const StreamOptions& opts, int batch, std::int64_t seq_len,
                         kernels::Backend& backend) {
  const int K = opts.device_update_layers, S = opts.device_update_slots;
  const int R = opts.resident_layers;
  ModelSizes sizes = executor_sizes(arena, opts, backend, R);
  auto total = [&](int k, int slots) -> Result<std::size_t> {
    sizes.optimizer_tail_bytes = DeviceOptimizerTail::staging_bytes(arena, k, slots, R);
    FERRY_ASSIGN_OR_RETURN(const DevicePlan d,
                           plan_device(geo, sizes, opts.policy, opts.prefetch + 1, batch * seq_len,
                                       backend, opts.gemm_precision));
    return d.total_bytes();
  };
  const std::size_t budget = opts.device_budget_bytes;
  FERRY_ASSIGN_OR_RETURN(const std::size_t need, total(K, S));
  if (need <= budget) return {};
  std::string hint;
  for (int s = S - 1; s >= 1 && hint.empty(); --s) {
    FERRY_ASSIGN_OR_RETURN(const std::size_t n, total(K, s));
    if (n <= budget) hint = fmt::format("--device-update-slots {} fits", s);
  }
  for (int k = K - 1; k >= 1 && hint.empty(); --k) {
    FERRY_ASSIGN_OR_RETURN(const std::size_t n, total(k, S));
    if (n <= budget) hint = fmt::format("--device-update-layers {} fits", k);
  }
  if (hint.empty()) hint = "not even 1 slot of layer 0 fits";
  return resource_exhausted(
      "train: --device-update-layers {} with {} staging slots needs {} of device-tier staging "
      "({} x {} of one layer's optimizer sections + {} widening); with it batch {} needs {}, the "
      "budget is {}: {}; or lower the batch or raise --device-budget-mib",
      K, S, mem::format_bytes(DeviceOptimizerTail::staging_bytes(arena, K, S, R)), S,
      mem::format_bytes(DeviceOptimizerTail::slot_bytes(arena.layout(), K, R)),
      mem::format_bytes(DeviceOptimizerTail::widen_bytes(arena.layout(), K, R)), batch,
      mem::format_bytes(need), mem::format_bytes(budget), hint);
}

}  // namespace

ModelSizes model_sizes(const HostArena& arena) {
  ModelSizes s{.globals_elements = arena.unit_elements(arena.globals_unit()),
               .max_layer_elements = arena.max_layer_elements(),
               .params = static_cast<std::int64_t>(arena.params().size()),
               .bf16_weights = arena.bf16_weights(),
               .bf16_grads = arena.bf16_grads()};
  for (int u = 0; u < arena.globals_unit(); ++u) {
    std::vector<bool> gemm;
    std::vector<std::int64_t> numel;
    for (int idx : arena.unit_params(u)) {
      gemm.push_back(arena.params()[static_cast<std::size_t>(idx)].gemm_weight);
      numel.push_back(arena.params()[static_cast<std::size_t>(idx)].n);
    }
    s.max_layer_f32_elements =
        std::max(s.max_layer_f32_elements, bf16_view_f32_elements(gemm, numel));
  }
  return s;
}

ModelSizes model_sizes(const model::ModelConfig& config, bool bf16_weights, bool bf16_grads) {
  ModelSizes s{.bf16_weights = bf16_weights, .bf16_grads = bf16_grads};
  const auto L = static_cast<std::size_t>(config.num_hidden_layers);
  std::vector<std::int64_t> layer(L, 0);
  std::vector<std::vector<bool>> gemm(L);
  std::vector<std::vector<std::int64_t>> numel(L);
  for (const model::ParamSpec& p : model::param_specs(config)) {
    ++s.params;
    (p.layer < 0 ? s.globals_elements : layer[static_cast<std::size_t>(p.layer)]) += p.numel();
    if (p.layer >= 0) {
      gemm[static_cast<std::size_t>(p.layer)].push_back(model::is_gemm_weight_role(p.role));
      numel[static_cast<std::size_t>(p.layer)].push_back(p.numel());
    }
  }
  for (std::int64_t n : layer) s.max_layer_elements = std::max(s.max_layer_elements, n);
  for (std::size_t l = 0; l < L; ++l) {
    s.max_layer_f32_elements =
        std::max(s.max_layer_f32_elements, bf16_view_f32_elements(gemm[l], numel[l]));
  }
  return s;
}

StreamExecutor::StreamExecutor(kernels::Backend& be, const StreamOptions& opts)
    : be_(be),
      opts_(opts),
      budget_(device_tier_for(be), opts.device_budget_bytes),
      host_act_budget_(pinned_tier_for(be)) {}

Result<std::unique_ptr<StreamExecutor>> StreamExecutor::create(const TrainState& s, int batch,
                                                               std::int64_t seq_len,
                                                               const StreamOptions& opts,
                                                               kernels::Backend& backend) {
  FERRY_ASSIGN_OR_RETURN(auto arena, HostArena::create(s, host_tier(backend)));
  return create(std::move(arena), s.config, s.optim.sr_seed, batch, seq_len, opts, backend);
}

mem::MemTier StreamExecutor::host_tier(const kernels::Backend& backend) {
  return pinned_tier_for(backend);
}

Result<std::unique_ptr<StreamExecutor>> StreamExecutor::create(
    std::unique_ptr<HostArena> arena, const model::ModelConfig& config, std::uint64_t sr_seed,
    int batch, std::int64_t seq_len, const StreamOptions& opts, kernels::Backend& backend) {
  if (backend.device() != Device::kCpu && backend.device() != Device::kCuda) {
    return unimplemented("train: the stream executor runs on CPU or CUDA backends, not {}",
                         to_string(backend.device()));
  }
  if (opts.prefetch < 1) return invalid_argument("train: --prefetch must be >= 1");
  FERRY_TRY(validate(opts.policy));
  FERRY_ASSIGN_OR_RETURN(const model::DecoderGeometry geo, model::make_geometry(config));
  if (opts.policy.layers() != geo.layers) {
    return invalid_argument("train: policy {} has {} boundaries, the model {} layers",
                            opts.policy.name, opts.policy.layers(), geo.layers);
  }
  std::unique_ptr<StreamExecutor> ex(new StreamExecutor(backend, opts));
  ex->geo_ = geo;
  ex->arena_ = std::move(arena);
  const bool auto_resident = opts.resident_layers == kResidentAuto;
  FERRY_TRY(ResidentLayers::check(*ex->arena_, auto_resident ? 0 : opts.resident_layers));
  int resident = auto_resident ? 0 : ResidentLayers::resolve(*ex->arena_, opts.resident_layers);
  FERRY_TRY(DeviceOptimizerTail::check(*ex->arena_, opts.device_update_layers,
                                       opts.device_update_slots, resident));
  // The batch first, without resident layers or the tail (today's refusal, naming the batch).
  const ModelSizes sizes = executor_sizes(*ex->arena_, opts, backend, 0);
  FERRY_TRY(check_budget(geo, sizes, opts.policy, opts.prefetch + 1, batch, seq_len,
                         opts.device_budget_bytes, backend, opts.gemm_precision));
  if (auto_resident) {
    // The most layers that fit at this batch (beside the tail's staging); then like a given K.
    FERRY_ASSIGN_OR_RETURN(
        resident, most_resident(*ex->arena_, geo, opts, batch, seq_len, backend, geo.layers));
    resident = std::max(resident, 0);
    FERRY_TRY(ResidentLayers::check(*ex->arena_, resident));
  }
  ex->opts_.resident_layers = resident;
  if (resident > 0) {
    FERRY_TRY(check_resident_budget(*ex->arena_, geo, ex->opts_, batch, seq_len, backend));
  }
  // `all` becomes the layers above the resident ones here; the executor keeps the resolved count.
  ex->opts_.device_update_layers =
      DeviceOptimizerTail::resolve_units(*ex->arena_, opts.device_update_layers, resident);
  if (ex->opts_.device_update_layers > 0) {
    FERRY_TRY(check_tail_budget(*ex->arena_, geo, ex->opts_, batch, seq_len, backend));
  }
  FERRY_TRY(ex->init(config, sr_seed, batch * seq_len));
  return ex;
}

Status StreamExecutor::init(const model::ModelConfig& config, std::uint64_t sr_seed,
                            std::int64_t max_tokens) {
  stats_.window_s.assign(static_cast<std::size_t>(2 * geo_.layers + 1), 0.0);
  stats_.window_exposed_s.assign(stats_.window_s.size(), 0.0);
  max_tokens_ = max_tokens;
  sr_seed_ = sr_seed;
  const ActivationPolicy& pol = opts_.policy;
  const int L = geo_.layers;
  const int resident = opts_.resident_layers;
  ModelSizes sizes = executor_sizes(*arena_, opts_, be_, resident);
  sizes.optimizer_tail_bytes = DeviceOptimizerTail::staging_bytes(
      *arena_, opts_.device_update_layers, opts_.device_update_slots, resident);
  FERRY_ASSIGN_OR_RETURN(plan_, plan_device(geo_, sizes, pol, opts_.prefetch + 1, max_tokens, be_,
                                            opts_.gemm_precision));
  FERRY_ASSIGN_OR_RETURN(device_, mem::make_arena(plan_.plan, device_tier_for(be_), budget_,
                                                  {.what = "train device tier"}));
  // ModelCompute's buffers are the device-tier workspace of this executor: charged here.
  FERRY_TRY(budget_.reserve(plan_.compute_bytes, "train compute workspace"));
  workspace_charged_ = true;
  const bool gpu = be_.device() != Device::kCpu;
  FERRY_ASSIGN_OR_RETURN(mem::StreamSet ss, mem::StreamSet::create(be_.device(), 0));
  streams_ = std::make_unique<mem::StreamSet>(std::move(ss));
  FERRY_ASSIGN_OR_RETURN(mem::StreamSet rs, mem::StreamSet::create(be_.device(), 0));
  refill_streams_ = std::make_unique<mem::StreamSet>(std::move(rs));
  FERRY_ASSIGN_OR_RETURN(mem::Event re, mem::Event::create(be_.device(), 0));
  refill_ready_ = std::make_unique<mem::Event>(std::move(re));
  FERRY_ASSIGN_OR_RETURN(mem::StreamSet as, mem::StreamSet::create(be_.device(), 0));
  act_streams_ = std::make_unique<mem::StreamSet>(std::move(as));
  auto event = [&](std::unique_ptr<mem::Event>& e) -> Status {
    FERRY_ASSIGN_OR_RETURN(mem::Event ev, mem::Event::create(be_.device(), 0));
    e = std::make_unique<mem::Event>(std::move(ev));
    return {};
  };
  FERRY_TRY(event(produced_));
  FERRY_TRY(event(staging_free_));
  for (int k = 0; k < 2; ++k) {
    FERRY_TRY(event(stored_[k]));
    FERRY_TRY(event(fetched_[k]));
    FERRY_TRY(event(buf_free_[k]));
  }
  fetch_buf_ = {dev(plan_.fetch), dev(plan_.transit[1])};
  if (gpu) {
    FERRY_ASSIGN_OR_RETURN(own_te_, mem::cuda_transfer_engine(0));
    te_ = own_te_.get();
  } else {
    te_ = &mem::host_transfer_engine();
  }
  // One shared workspace for the layers re-run in backward, one of its own per kept layer.
  FERRY_ASSIGN_OR_RETURN(
      compute_, model::ModelCompute::create(geo_, max_tokens, be_, 1, gpu ? &cs() : nullptr,
                                            opts_.gemm_precision, model::AttnBwdWorkspace::kDefault,
                                            pol.keep));
  FERRY_CHECK(
      compute_->total_bytes() == plan_.compute_bytes && compute_->kept_bytes() == plan_.kept_bytes,
      "train: ModelCompute holds {} bytes ({} kept), the device plan {} ({} kept)",
      compute_->total_bytes(), compute_->kept_bytes(), plan_.compute_bytes, plan_.kept_bytes);

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
  FERRY_ASSIGN_OR_RETURN(host_acts_, mem::make_arena(hp, pinned_tier_for(be_), host_act_budget_,
                                                     {.what = "train host activations"}));
  if (nvme_) {
    read_ahead_ = std::make_unique<NvmeReadAhead>(
        *nvme_, std::vector<std::byte*>{host_acts_.data(nvme_staging_)},
        std::vector<const mem::Event*>{staging_free_.get()});
  }

  int opt_threads = opts_.optimizer_threads;
  if (opt_threads <= 0) {
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    opt_threads = gpu ? std::max(1, hw - 2) : 1;
  }
  opt_ = std::make_unique<LayerOptimizer>(*arena_, opt_threads, opts_.cpu_update_hook,
                                          opts_.head_update);
  if (resident > 0) {
    // Their updates run in finish_step on the device; the CPU worker (and the tail) skip them.
    std::vector<int> units;
    for (int u = 0; u < resident; ++u) units.push_back(u);
    opt_->set_external(units);
  }
  if (opts_.device_update_layers > 0) {
    FERRY_ASSIGN_OR_RETURN(mem::StreamSet ts, mem::StreamSet::create(be_.device(), 0));
    tail_streams_ = std::make_unique<mem::StreamSet>(std::move(ts));
    FERRY_ASSIGN_OR_RETURN(
        tail_, DeviceOptimizerTail::create(
                   *arena_, *opt_, opts_.device_update_layers, opts_.device_update_slots, be_, *te_,
                   device_.as<std::uint8_t>(plan_.optimizer_tail),
                   plan_.plan.slot(plan_.optimizer_tail).size_bytes, *tail_streams_,
                   opts_.device_update_hook, opts_.device_prestage_hook, resident));
  }
  std::vector<float*> slots;
  for (mem::SlotId id : plan_.slots) slots.push_back(dev(id));
  // Resident layers are read in place: they leave the weight ring's schedule.
  std::vector<int> schedule;
  for (int l : weight_schedule(pol)) {
    if (l >= resident) schedule.push_back(l);
  }
  // Per micro-batch: each schedule item's acquire, and per layer at most a boundary store and a
  // fetch (NVMe: copy + disk each), a gradient slot and its refill; the globals and the flush.
  // (each NVMe fetch: staging + disk + landing), the transit buffers' stores.
  const int max_waits = static_cast<int>(schedule.size()) + 9 * L + 20;
  landing_ = std::make_unique<Bf16Landing>(be_, device_.as<std::uint16_t>(plan_.stage16),
                                           plan_.stage16_elements);
  // The head's bf16 staging: the embedding's gradient region (embed_elements f32, so twice as
  // many bf16 values: room for the final norm + an untied lm_head of the same [V, C]).
  FERRY_ASSIGN_OR_RETURN(mem::StreamSet hs, mem::StreamSet::create(be_.device(), 0));
  head_streams_ = std::make_unique<mem::StreamSet>(std::move(hs));
  FERRY_TRY(event(head_landed_));
  head_landing_ = std::make_unique<Bf16Landing>(be_, device_.as<std::uint16_t>(plan_.globals_g),
                                                2 * opt_->embed_elements());
  std::vector<std::uint16_t*> twins;
  if (plan_.bf16_weight_views) {
    view_landing_ = std::make_unique<Bf16ViewLanding>(be_, *arena_);
    FERRY_CHECK(view_landing_->max_f32_elements() == sizes.max_layer_f32_elements,
                "train: bf16 weight views: the slot's f32 part is {} elements, the plan's {}",
                view_landing_->max_f32_elements(), sizes.max_layer_f32_elements);
    for (mem::SlotId id : plan_.slots16) twins.push_back(device_.as<std::uint16_t>(id));
  }
  if (resident > 0) {
    FERRY_ASSIGN_OR_RETURN(
        resident_,
        ResidentLayers::create(*arena_, resident, be_, device_.as<std::uint8_t>(plan_.resident),
                               plan_.plan.slot(plan_.resident).size_bytes, view_landing_.get()));
    FERRY_TRY(resident_->upload(*te_, cs()));
  }
  FERRY_ASSIGN_OR_RETURN(
      streamer_,
      WeightStreamer::create(*arena_, *opt_, std::move(slots), std::move(schedule), *te_,
                             streams_->h2d(), cs(), landing_.get(), view_landing_.get(), twins));
  FERRY_ASSIGN_OR_RETURN(clock_,
                         ExposureClock::create(gpu ? &cs() : nullptr, max_waits, 2 * L + 1));

  // Views, bound once: no allocation in the step loop.
  const std::vector<model::ParamSpec> specs = model::param_specs(config);
  if (specs.size() != arena_->params().size()) {
    return invalid_argument("train: the arena holds {} parameters, the model has {}",
                            arena_->params().size(), specs.size());
  }
  for (const ParamLoc& p : arena_->params()) {
    if (p.n != specs[static_cast<std::size_t>(p.index)].numel()) {
      return invalid_argument("train: the arena's parameter {} has {} elements, the model's {}",
                              specs[static_cast<std::size_t>(p.index)].hf_name, p.n,
                              specs[static_cast<std::size_t>(p.index)].numel());
    }
  }
  const Device d = be_.device();
  globals_ = bind_views(specs, *arena_, geo_, true, d,
                        [&](int) -> const float* { return dev(plan_.globals_w); });
  globals_grad_ = writable(bind_views(specs, *arena_, geo_, true, d,
                                      [&](int) -> const float* { return dev(plan_.globals_g); }));
  for (std::size_t k = 0; k < plan_.slots.size(); ++k) {
    if (!view_landing_) {
      const mem::SlotId id = plan_.slots[k];
      slot_params_.push_back(
          bind_views(specs, *arena_, geo_, false, d, [&](int) -> const float* { return dev(id); }));
      continue;
    }
    // bf16 weight views: GEMM weights in the twin at their arena offsets (bf16), the rest in the
    // slot's f32 part (bf16_widen.h).
    const float* f32 = dev(plan_.slots[k]);
    const std::uint16_t* b16 = device_.as<std::uint16_t>(plan_.slots16[k]);
    model::ModelParams mp;
    for (std::size_t i = 0; i < arena_->params().size(); ++i) {
      const ParamLoc& p = arena_->params()[i];
      if (p.unit == arena_->globals_unit()) continue;
      const model::ParamSpec& spec = specs[static_cast<std::size_t>(p.index)];
      const std::int64_t at = view_landing_->f32_offset(static_cast<int>(i));
      *model::param_slot(mp, spec, geo_) =
          at < 0 ? view_at(b16 + p.offset, spec.shape, d, DType::kBF16)
                 : view_at(f32 + at, spec.shape, d);
    }
    slot_params_.push_back(std::move(mp));
  }
  if (resident_) {
    // Layer u < K at its resident pieces; the other layers' entries point at slot 0 (unused).
    model::ModelParams rg;
    for (std::size_t i = 0; i < arena_->params().size(); ++i) {
      const ParamLoc& p = arena_->params()[i];
      if (p.unit == arena_->globals_unit()) continue;
      const model::ParamSpec& spec = specs[static_cast<std::size_t>(p.index)];
      const bool res = resident_->resident(p.unit);
      const float* g = res ? resident_->grads(p.unit) : dev(plan_.grads[0]);
      *model::param_slot(rg, spec, geo_) = view_at(g + p.offset, spec.shape, d);
      if (!res) {
        *model::param_slot(resident_params_, spec, geo_) =
            view_at(dev(plan_.slots[0]) + p.offset, spec.shape, d);
        continue;
      }
      const std::int64_t at = view_landing_ ? view_landing_->f32_offset(static_cast<int>(i)) : 0;
      *model::param_slot(resident_params_, spec, geo_) =
          view_landing_ && at < 0
              ? view_at(resident_->weights16(p.unit) + p.offset, spec.shape, d, DType::kBF16)
              : view_at(resident_->weights_f32(p.unit) + (view_landing_ ? at : p.offset),
                        spec.shape, d);
    }
    resident_grads_ = writable(rg);
  }
  for (mem::SlotId id : plan_.grads) {
    grad_slots_.push_back(writable(
        bind_views(specs, *arena_, geo_, false, d, [&](int) -> const float* { return dev(id); })));
  }
  // The drain moves each slot's bf16 twin with bf16 gradients (half the D2H bytes).
  std::vector<void*> gslots;
  for (int k = 0; k < kGradSlots; ++k) {
    const auto i = static_cast<std::size_t>(k);
    gslots.push_back(arena_->bf16_grads() ? static_cast<void*>(device_.data(plan_.grad16[i]))
                                          : static_cast<void*>(dev(plan_.grads[i])));
  }
  FERRY_ASSIGN_OR_RETURN(drain_, GradDrain::create(std::move(gslots), *te_, streams_->d2h(), cs()));
  spans_ = pol.spans();
  for (auto it = spans_.rbegin(); it != spans_.rend(); ++it) {
    if (!offloaded(it->start)) continue;
    fetch_order_.push_back(it->start);
    if (pol.homes[it->start] == Home::kNvme) nvme_fetch_records_.push_back(nvme_record_[it->start]);
  }
  sumsq_.assign(arena_->params().size(), 0.0);
  sumsq_f32_.assign(arena_->params().size(), 0.0f);
  return {};
}

std::unique_ptr<HostArena> StreamExecutor::release_arena(std::unique_ptr<StreamExecutor> ex) {
  ex->wait_optimizer();  // a failed device tail still marks its units done: no hang
  // The resident layers' state back into the arena (its reader may save it). NOTE(resident):
  // a failure here cannot be returned; store_to, which checkpoints use, reports it.
  if (ex->resident_) (void)ex->resident_->download(*ex->te_, ex->cs());
  // The destructor stops the optimizer and the copy threads and waits for the GPU streams, which
  // may still read or write the arena's pinned memory; the arena outlives them.
  std::unique_ptr<HostArena> arena = std::move(ex->arena_);
  ex.reset();
  return arena;
}

StreamExecutor::~StreamExecutor() {
  read_ahead_.reset();  // a read in progress finishes into its staging buffer
  drain_.reset();
  streamer_.reset();
  tail_.reset();
  opt_.reset();
  // Queued GPU work may still read the device arena or ModelCompute's buffers.
  if (head_streams_) (void)head_streams_->synchronize();
  if (tail_streams_) (void)tail_streams_->synchronize();
  if (refill_streams_) (void)refill_streams_->synchronize();
  if (act_streams_) (void)act_streams_->synchronize();
  if (streams_) (void)streams_->synchronize();
  compute_.reset();
  if (workspace_charged_) budget_.release(plan_.compute_bytes);
}

TensorView StreamExecutor::act_view(float* p, std::int64_t T) const {
  return TensorView::contiguous(p, DType::kF32, be_.device(), {T, std::int64_t(geo_.hidden)});
}

// On the compute stream, in order with the kernels around it; the copy's time on the compute
// stream is exposed by construction (the ExposureClock pair around it measures it).
Status StreamExecutor::copy(void* dst, const void* src, std::size_t bytes, mem::CopyKind kind,
                            std::uint64_t* counter) {
  FERRY_TRY(clock_->wait_begin());
  const Status st = te_->copy(dst, src, bytes, kind, cs());
  FERRY_TRY(clock_->wait_end());
  FERRY_TRY(st);
  *counter += bytes;
  return {};
}

// Compute waits (host-blocked) for `what`; the clock charges the GPU's idle time meanwhile.
template <typename F>
auto StreamExecutor::timed_wait(F&& what) -> decltype(what()) {
  if (const Status st = clock_->wait_begin(); !st.ok()) return st;
  auto r = what();
  if (const Status st = clock_->wait_end(); !st.ok()) return st;
  return r;
}

Result<model::PackedBatch> StreamExecutor::device_batch(const model::PackedBatch& b) {
  if (be_.device() == Device::kCpu) return b;
  const std::int64_t T = b.ids.numel();
  std::int32_t* base = device_.as<std::int32_t>(plan_.batch);
  const auto put = [&](const ConstTensorView& v, std::int32_t* dst,
                       std::int64_t cap) -> Result<ConstTensorView> {
    const std::int64_t n = v.numel();
    if (n == 0) return Result<ConstTensorView>(ConstTensorView{});
    if (v.dtype != DType::kI32 || v.device != Device::kCpu || !v.is_contiguous() || n > cap) {
      return invalid_argument("train: batch tensors must be contiguous host i32 of <= {} values",
                              cap);
    }
    FERRY_TRY(te_->h2d(dst, v.data, static_cast<std::size_t>(n) * sizeof(std::int32_t), cs()));
    return Result<ConstTensorView>(
        ConstTensorView::contiguous(dst, DType::kI32, be_.device(), {n}));
  };
  model::PackedBatch d;
  FERRY_ASSIGN_OR_RETURN(d.ids, put(b.ids, base, max_tokens_));
  FERRY_ASSIGN_OR_RETURN(d.positions, put(b.positions, base + max_tokens_, max_tokens_));
  FERRY_ASSIGN_OR_RETURN(d.targets, put(b.targets, base + 2 * max_tokens_, max_tokens_));
  FERRY_ASSIGN_OR_RETURN(d.cu_seqlens, put(b.cu_seqlens, base + 3 * max_tokens_, T + 1));
  return d;
}

float* StreamExecutor::boundary_ptr(int i) const {
  if (i == geo_.layers) return dev(plan_.x_final);
  if (opts_.policy.homes[i] == Home::kDevice) return dev(plan_.boundary[i]);
  return dev(plan_.transit[static_cast<std::size_t>(i % 2)]);
}

TensorView StreamExecutor::flat(void* p, DType t, std::int64_t n) const {
  return TensorView::contiguous(p, t, be_.device(), {n});
}

// f32 -> its bf16 rounding in `b16` (what leaves for the host); with back, the f32 values become
// that rounding too (the norm and later micro-batches read them). On the compute stream.
Status StreamExecutor::round_to_bf16(float* f32, void* b16, std::int64_t n, bool back) {
  FERRY_TRY(
      be_.convert({.out = flat(b16, DType::kBF16, n), .in = flat(f32, DType::kF32, n)}, cs()));
  if (!back) return {};
  return be_.convert({.out = flat(f32, DType::kF32, n), .in = flat(b16, DType::kBF16, n)}, cs());
}

bool StreamExecutor::offloaded(int i) const {
  const Home h = opts_.policy.homes[i];
  return h == Home::kHost || h == Home::kNvme;
}

// Boundary i (written by compute into a transit buffer) leaves on the activation d2h stream once
// compute has produced it; compute reuses the buffer after stored_[i % 2].
Status StreamExecutor::store_boundary(int i, const float* x, std::int64_t T) {
  if (!offloaded(i)) return {};
  const std::size_t bytes = static_cast<std::size_t>(T) * geo_.hidden * sizeof(float);
  const bool nvme = opts_.policy.homes[i] == Home::kNvme;
  void* dst = host_acts_.data(nvme ? nvme_staging_ : host_boundary_[i]);
  FERRY_TRY(produced_->record(cs()));
  FERRY_TRY(act_d2h().wait(*produced_));
  FERRY_TRY(te_->copy(dst, x, bytes, mem::CopyKind::kDeviceToHost, act_d2h()));
  stats_.act_d2h += bytes;
  FERRY_TRY(stored_[static_cast<std::size_t>(i % 2)]->record(act_d2h()));
  if (nvme) {
    // The host writes the staging buffer to NVMe once the copy has landed (it blocks the host:
    // the GPU keeps running what is queued).
    FERRY_TRY(timed_wait([&]() -> Status {
      FERRY_TRY(act_d2h().synchronize());
      const Timer disk;
      Status st = nvme_->write(nvme_record_[i], host_acts_.data(nvme_staging_));
      stats_.nvme_write_s += disk.elapsed_s();
      return st;
    }));
    stats_.nvme_write += nvme_->record_stride();
  }
  return {};
}

Status StreamExecutor::wait_transit_stored(int k) {
  return timed_wait([&] { return cs().wait(*stored_[static_cast<std::size_t>(k)]); });
}

// Boundary i into fetch buffer `buf` on the activation h2d stream, after the buffer's last
// reader (buf_free_); the forward's stores were ordered before every fetch (micro_batch).
Status StreamExecutor::fetch_into(int buf, int i, std::int64_t T) {
  const std::size_t bytes = static_cast<std::size_t>(T) * geo_.hidden * sizeof(float);
  const auto b = static_cast<std::size_t>(buf);
  FERRY_TRY(act_h2d().wait(*buf_free_[b]));
  if (opts_.policy.homes[i] == Home::kHost) {
    FERRY_TRY(te_->copy(fetch_buf_[b], host_acts_.data(host_boundary_[i]), bytes,
                        mem::CopyKind::kHostToDevice, act_h2d()));
  } else {
    // Read ahead since the loss window (nvme_read_ahead.h); the host waits only for what the disk
    // has not finished by now.
    const int m = nvme_fetches_taken_++;
    FERRY_ASSIGN_OR_RETURN(const NvmeReadAhead::Landed landed,
                           timed_wait([&] { return read_ahead_->take(m); }));
    stats_.nvme_read_s += landed.disk_s;
    stats_.nvme_read += nvme_->record_stride();
    FERRY_TRY(
        te_->copy(fetch_buf_[b], landed.data, bytes, mem::CopyKind::kHostToDevice, act_h2d()));
    FERRY_TRY(staging_free_->record(act_h2d()));
    read_ahead_->release(m);
  }
  stats_.act_h2d += bytes;
  FERRY_TRY(fetched_[b]->record(act_h2d()));
  return {};
}

Status StreamExecutor::issue_fetch(std::int64_t T) {
  if (fetches_issued_ >= static_cast<int>(fetch_order_.size())) return {};
  const int n = fetches_issued_++;
  return fetch_into(n % 2, fetch_order_[static_cast<std::size_t>(n)], T);
}

Result<const float*> StreamExecutor::take_fetch() {
  if (fetches_taken_ >= fetches_issued_) {
    return internal_error("train: boundary fetch {} taken before it was issued", fetches_taken_);
  }
  const auto b = static_cast<std::size_t>(fetches_taken_++ % 2);
  FERRY_TRY(timed_wait([&] { return cs().wait(*fetched_[b]); }));
  return static_cast<const float*>(fetch_buf_[b]);
}

// The head part of the globals (elements [E, G) of the unit: final norm + untied lm_head) into
// the device globals, on the head stream. Stream order (GPU): the H2D (bf16: into the staging, the
// embedding's gradient region, then the widening kernel into globals.weights) follows nothing on
// the head stream; what it overwrites was last read or written by the previous step's compute
// stream, which the end of every micro-batch synchronized. The compute stream waits for
// head_landed_ before the head reads the weights and before it zeroes the staging region.
// Emulated tier: host streams, the copy (and the in-place widening) has run when this returns.
Status StreamExecutor::land_head() {
  const int G = arena_->globals_unit();
  const std::int64_t E = opt_->embed_elements(), n = arena_->unit_elements(G) - E;
  mem::Stream& s = head_streams_->h2d();
  if (arena_->bf16_weights()) {
    FERRY_TRY(head_landing_->land(dev(plan_.globals_w) + E, arena_->w16(G) + E, n, *te_, s));
    stats_.globals_h2d += static_cast<std::size_t>(n) * sizeof(std::uint16_t);
  } else {
    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
    FERRY_TRY(te_->h2d(dev(plan_.globals_w) + E, arena_->weights(G) + E, bytes, s));
    stats_.globals_h2d += bytes;
  }
  FERRY_TRY(head_landed_->record(s));
  head_pending_ = false;
  return {};
}

// On the device copy of the unit's gradient, right after its backward, into the device's
// per-parameter vector: the global norm then needs no pass over the host arena, and a GPU reads
// the P floats back once per step (read_sumsq).
Status StreamExecutor::take_sumsq(int unit, const float* grads) {
  float* sums = dev(plan_.sumsq);
  const std::size_t ws_bytes = plan_.plan.slot(plan_.sumsq_ws).size_bytes;
  const TensorView ws = ws_bytes == 0
                            ? TensorView{}
                            : TensorView::contiguous(dev(plan_.sumsq_ws), DType::kU8, be_.device(),
                                                     {static_cast<std::int64_t>(ws_bytes)});
  for (int idx : arena_->unit_params(unit)) {
    const ParamLoc& p = arena_->params()[static_cast<std::size_t>(idx)];
    const TensorView out = TensorView::contiguous(sums + idx, DType::kF32, be_.device(), {1});
    const ConstTensorView g =
        ConstTensorView::contiguous(grads + p.offset, DType::kF32, be_.device(), {p.n});
    FERRY_TRY(be_.sum_squares({.out = out, .x = g, .workspace = ws}, cs()));
  }
  return {};
}

// After the last micro-batch's work completed: the step's per-parameter sums, as the in-memory
// executor has them (f32 sums widened to double).
Status StreamExecutor::read_sumsq() {
  const std::size_t n = sumsq_f32_.size();
  FERRY_TRY(te_->d2h(sumsq_f32_.data(), dev(plan_.sumsq), n * sizeof(float), cs()));
  FERRY_TRY(cs().synchronize());
  for (std::size_t i = 0; i < n; ++i) sumsq_[i] = static_cast<double>(sumsq_f32_[i]);
  return {};
}

void StreamExecutor::begin_step(int accum) {
  accum_ = accum;
  micro_ = 0;
}

// The clock measures the wait (host time, or the GPU's idle time meanwhile).
Result<int> StreamExecutor::acquire_weights(int j) {
  return timed_wait([&] { return streamer_->acquire(j); });
}

Result<StreamExecutor::LayerWeights> StreamExecutor::layer_weights(int l, int j) {
  if (resident_ && resident_->resident(l)) {
    return LayerWeights{.params = &resident_params_.layers[static_cast<std::size_t>(l)],
                        .slot = -1};
  }
  FERRY_ASSIGN_OR_RETURN(const int slot, acquire_weights(j));
  return LayerWeights{.params = &slot_params_[static_cast<std::size_t>(slot)].layers[l],
                      .slot = slot};
}

void StreamExecutor::release_weights(const LayerWeights& w, int& j) {
  if (w.slot >= 0) streamer_->release(j++);
}

// A resident layer's backward: the internals (re-run unless kept), then the backward into its
// resident f32 gradients; with bf16 gradients they are rounded (and read back) after every
// micro-batch, as the in-memory executor's round_grads_to_bf16 and the drained layers' refill
// from the host's bf16 sum give; on the last micro-batch the norm's sums.
Status StreamExecutor::internals_for_backward(int l, const model::LayerTensors<ConstTensorView>& p,
                                              const model::PackedBatch& b, const TensorView& x_in) {
  if (opts_.policy.kept(l)) {
    ++stats_.kept_layers;
    return ok_status();
  }
  ++stats_.layer_forwards;
  ++stats_.internals_forwards;
  return compute_->layer_forward_internals(l, p, b, x_in);
}

Status StreamExecutor::resident_backward(int l, const model::LayerTensors<ConstTensorView>& p,
                                         const model::PackedBatch& b, const TensorView& x_in, int a,
                                         bool last) {
  float* g = resident_->grads(l);
  const std::int64_t ln = arena_->unit_elements(l);
  if (a == 0) FERRY_TRY(te_->zero(g, static_cast<std::size_t>(ln) * sizeof(float), cs()));
  FERRY_TRY(internals_for_backward(l, p, b, x_in));
  ++stats_.layer_backwards;
  FERRY_TRY(
      compute_->layer_backward(l, p, resident_grads_.layers[static_cast<std::size_t>(l)], b, x_in));
  if (arena_->bf16_grads()) FERRY_TRY(round_to_bf16(g, resident_->grads16(), ln, true));
  if (last) FERRY_TRY(take_sumsq(l, g));
  return {};
}

Result<model::ForwardResult> StreamExecutor::micro_batch(const model::PackedBatch& host_batch) {
  const std::int64_t T = host_batch.ids.numel();
  if (T <= 0 || T > max_tokens_) {
    return invalid_argument("train: micro-batch of {} tokens outside [1, {}] planned", T,
                            max_tokens_);
  }
  if (micro_ >= accum_) return invalid_argument("train: more micro-batches than begin_step said");
  if (tail_) FERRY_TRY(tail_->error());  // the previous update's device units
  const int a = micro_++;
  const bool last = micro_ == accum_;
  const int L = geo_.layers, G = arena_->globals_unit();
  const std::size_t gbytes = static_cast<std::size_t>(arena_->unit_elements(G)) * sizeof(float);
  // The globals: the embedding [0, E) elements, then the head part (final norm, lm_head).
  const std::int64_t E = opt_->embed_elements();
  const auto ebytes = static_cast<std::size_t>(E) * sizeof(float);
  clock_->begin_micro_batch();
  if (a == 0) {
    // The embedding alone: the head's update may still run (it is waited for at the head).
    FERRY_TRY(timed_wait([&]() -> Status {
      opt_->wait_ready(G);
      return {};
    }));
    if (arena_->bf16_weights()) {
      // Lands through the staging buffer the weight thread also uses: done (synchronized) before
      // that thread starts this micro-batch's copies (bf16_widen.h). With bf16 weight views there
      // is no such buffer (layers land in their slots' twins): the embedding goes through the
      // globals' gradient region, as the head does, before anything writes it this step (the head
      // gradients are zeroed after this, the head lands after this synchronize).
      const Bf16Landing& lands = plan_.bf16_weight_views ? *head_landing_ : *landing_;
      FERRY_TRY(timed_wait([&]() -> Status {
        FERRY_TRY(lands.land(dev(plan_.globals_w), arena_->w16(G), E, *te_, cs()));
        return cs().synchronize();
      }));
      stats_.globals_h2d += static_cast<std::size_t>(E) * sizeof(std::uint16_t);
    } else {
      FERRY_TRY(copy(dev(plan_.globals_w), arena_->weights(G), ebytes, mem::CopyKind::kHostToDevice,
                     &stats_.globals_h2d));
    }
    // The head's gradients now; the embedding's region may be the head's staging (land_head), so
    // it is zeroed once the head landed.
    FERRY_TRY(te_->zero(dev(plan_.globals_g) + E, gbytes - ebytes, cs()));
    head_pending_ = true;
  }
  streamer_->start_micro_batch();
  // The forward's NVMe stores write the staging record: no read of an earlier micro-batch that
  // failed before taking all its reads may still be landing in it (an empty sequence waits for a
  // read in progress and starts none).
  if (read_ahead_) read_ahead_->begin({});
  FERRY_ASSIGN_OR_RETURN(const model::PackedBatch b, device_batch(host_batch));
  fetches_issued_ = fetches_taken_ = nvme_fetches_taken_ = 0;
  const bool any_offloaded = !fetch_order_.empty();
  // Forward. A boundary kept off the device is written into transit buffer i % 2, whose previous
  // store (boundary i - 2) must have left first.
  // Window f0 opens before the embedding: boundary 0's store (an NVMe one waits for its disk
  // write) counts in f0, as the plan charges it (src/plan/problem.h nvme_store_window).
  FERRY_TRY(clock_->window_begin(0));
  if (any_offloaded && opts_.policy.homes[0] != Home::kDevice) FERRY_TRY(wait_transit_stored(0));
  FERRY_TRY(compute_->embed(globals_.embed, b, act_view(boundary_ptr(0), T)));
  FERRY_TRY(store_boundary(0, boundary_ptr(0), T));
  int j = 0;
  for (int l = 0; l < L; ++l) {
    if (l > 0) FERRY_TRY(clock_->window_begin(l));
    FERRY_ASSIGN_OR_RETURN(const LayerWeights w, layer_weights(l, j));
    if (any_offloaded && l + 1 < L && opts_.policy.homes[l + 1] != Home::kDevice) {
      FERRY_TRY(wait_transit_stored((l + 1) % 2));
    }
    ++stats_.layer_forwards;
    FERRY_TRY(compute_->layer_forward(l, *w.params, b, act_view(boundary_ptr(l), T),
                                      act_view(boundary_ptr(l + 1), T)));
    release_weights(w, j);
    if (l + 1 < L) FERRY_TRY(store_boundary(l + 1, boundary_ptr(l + 1), T));
    // The head's weights go up as soon as its update is ready, beside the forward.
    if (head_pending_ && opt_->is_ready(opt_->head_unit())) FERRY_TRY(land_head());
    FERRY_TRY(clock_->window_end());
  }
  FERRY_TRY(clock_->window_begin(L));
  // Every NVMe store of the forward is on disk (store_boundary waits for its write): the disk
  // reads the backward's NVMe boundaries from now on, in fetch order.
  if (read_ahead_) read_ahead_->begin(nvme_fetch_records_);
  if (a == 0) {
    // The forward reached the head: its update (host wait, measured in the loss window), its
    // landing (compute waits for the head stream's event: GPU idle time if it is not there yet),
    // then the embedding's gradients are zeroed (after the landing read its staging; before the
    // head's backward, which with tied embeddings accumulates into them).
    if (head_pending_) {
      FERRY_TRY(timed_wait([&]() -> Status {
        opt_->wait_ready(opt_->head_unit());
        return {};
      }));
      FERRY_TRY(land_head());
    }
    FERRY_TRY(timed_wait([&] { return cs().wait(*head_landed_); }));
    FERRY_TRY(te_->zero(dev(plan_.globals_g), ebytes, cs()));
  }
  // Both fetch buffers fill during the loss: every fetch follows every store of the forward (the
  // host homes it reads, transit.1 it may overwrite) and transit.1's forward readers are queued.
  // Host-homed ones are issued before the loss is queued; an NVMe one may wait for its read, so
  // those wait until the loss is queued.
  auto issue_first_fetches = [&](bool nvme_too) -> Status {
    while (fetches_issued_ < std::min<int>(2, static_cast<int>(fetch_order_.size()))) {
      const int i = fetch_order_[static_cast<std::size_t>(fetches_issued_)];
      if (!nvme_too && opts_.policy.homes[i] == Home::kNvme) break;
      FERRY_TRY(issue_fetch(T));
    }
    return {};
  };
  if (any_offloaded) {
    FERRY_TRY(act_streams_->order(act_d2h(), act_h2d()));
    FERRY_TRY(buf_free_[1]->record(cs()));
    FERRY_TRY(issue_first_fetches(false));
  }
  const ConstTensorView x_final = act_view(dev(plan_.x_final), T);
  FERRY_ASSIGN_OR_RETURN(const model::ForwardResult r,
                         compute_->head_forward(globals_.final_norm, globals_.lm_head, b, x_final));
  FERRY_TRY(compute_->head_backward(globals_.final_norm, globals_.lm_head, globals_grad_.final_norm,
                                    globals_grad_.lm_head, b, x_final));
  // Backward writes no transit buffer (its re-forwards are internals-only, no output; fetches
  // land in the fetch buffer and transit.1 after the stores): the next forward waits for stores.
  if (any_offloaded) FERRY_TRY(issue_first_fetches(true));
  FERRY_TRY(clock_->window_end());
  // The forward waited for every layer's update (the weight thread copies a layer only once it is
  // ready), so the states of the device tail's first layers are final until the next update: they
  // go up into its staging slots beside this backward (its thread, its h2d stream).
  if (last && tail_ && opts_.device_update_prestage) tail_->prestage();
  // Backward, span by span from the top.
  for (auto it = spans_.rbegin(); it != spans_.rend(); ++it) {
    const int s = it->start, e = it->end;
    // The span's fetch wait and recompute run in the top layer's window.
    FERRY_TRY(clock_->window_begin(2 * L - (e - 1)));
    const float* xs = nullptr;
    if (offloaded(s)) {
      FERRY_ASSIGN_OR_RETURN(xs, take_fetch());
    } else {
      xs = dev(plan_.boundary[static_cast<std::size_t>(s)]);
    }
    auto input_of = [&](int l) -> const float* {
      return l == s ? xs : dev(plan_.recompute[static_cast<std::size_t>(l - s - 1)]);
    };
    // Regenerate boundaries s+1 .. e-1. A kept layer among s..e-2 runs here too (its output is
    // the boundary above it) and so rewrites its kept workspace: with the same bits (the same
    // kernels on the same input and weights; the kernels are deterministic, which every
    // recomputing policy's bit-identity already relies on), and in any case internals that
    // match the regenerated x_in its backward reads, as a re-run would give.
    for (int l = s; l <= e - 2; ++l) {
      FERRY_ASSIGN_OR_RETURN(const LayerWeights w, layer_weights(l, j));
      ++stats_.layer_forwards;
      FERRY_TRY(compute_->layer_forward(
          l, *w.params, b, act_view(const_cast<float*>(input_of(l)), T),
          act_view(dev(plan_.recompute[static_cast<std::size_t>(l - s)]), T)));
      release_weights(w, j);
    }
    for (int l = e - 1; l >= s; --l) {
      if (l != e - 1) FERRY_TRY(clock_->window_begin(2 * L - l));
      FERRY_ASSIGN_OR_RETURN(const LayerWeights w, layer_weights(l, j));
      const model::LayerTensors<ConstTensorView>& p = *w.params;
      const TensorView x_in = act_view(const_cast<float*>(input_of(l)), T);
      if (w.slot < 0) {
        // A resident layer: its gradients accumulate in place (zeroed by the first micro-batch),
        // its weights are read in place; nothing drains, nothing is refilled.
        FERRY_TRY(resident_backward(l, p, b, x_in, a, last));
        if (l == s && offloaded(s)) {
          FERRY_TRY(buf_free_[static_cast<std::size_t>((fetches_taken_ - 1) % 2)]->record(cs()));
          FERRY_TRY(issue_fetch(T));
        }
        FERRY_TRY(clock_->window_end());
        continue;
      }
      // The gradient slot first: on micro-batches after the first it is refilled with the host's
      // running sum on the refill stream, while compute re-runs the layer's internals (the copy
      // is the largest of the window: f32, twice the bf16 weights' bytes).
      const std::size_t lbytes = static_cast<std::size_t>(arena_->unit_elements(l)) * sizeof(float);
      FERRY_ASSIGN_OR_RETURN(const int gk,
                             timed_wait([&]() -> Result<int> { return drain_->acquire(); }));
      float* gslot = dev(plan_.grads[static_cast<std::size_t>(gk)]);
      const bool g16 = arena_->bf16_grads();
      const std::int64_t ln = arena_->unit_elements(l);
      void* gslot16 = g16 ? device_.data(plan_.grad16[static_cast<std::size_t>(gk)]) : nullptr;
      if (a == 0) {
        FERRY_TRY(te_->zero(gslot, lbytes, cs()));
      } else if (g16) {  // the host's bf16 running sum, widened into the slot on the refill stream
        FERRY_TRY(te_->h2d(gslot16, arena_->grads16(l), lbytes / 2, refill()));
        FERRY_TRY(be_.convert(
            {.out = flat(gslot, DType::kF32, ln), .in = flat(gslot16, DType::kBF16, ln)},
            refill()));
        FERRY_TRY(refill_ready_->record(refill()));
        stats_.grad_h2d += lbytes / 2;
      } else {
        FERRY_TRY(te_->h2d(gslot, arena_->grads(l), lbytes, refill()));
        FERRY_TRY(refill_ready_->record(refill()));
        stats_.grad_h2d += lbytes;
      }
      FERRY_TRY(internals_for_backward(l, p, b, x_in));
      if (a > 0) {  // the backward accumulates into the refilled slot: the GPU waits (measured)
        FERRY_TRY(timed_wait([&] { return cs().wait(*refill_ready_); }));
      }
      ++stats_.layer_backwards;
      FERRY_TRY(compute_->layer_backward(l, p, grad_slots_[gk].layers[l], b, x_in));
      release_weights(w, j);
      if (g16) {
        // The slot's bf16 rounding leaves; the last micro-batch's norm is taken on those values.
        FERRY_TRY(round_to_bf16(gslot, gslot16, ln, last));
        if (last) FERRY_TRY(take_sumsq(l, gslot));
        drain_->submit(arena_->grads16(l), lbytes / 2);
      } else {
        if (last) FERRY_TRY(take_sumsq(l, gslot));
        drain_->submit(arena_->grads(l), lbytes);
      }
      if (l == s && offloaded(s)) {
        // The span's last reader of its fetch buffer is queued: the fetch two spans down may
        // fill it (issued here; an NVMe one waits if its read ahead has not landed yet).
        FERRY_TRY(buf_free_[static_cast<std::size_t>((fetches_taken_ - 1) % 2)]->record(cs()));
        FERRY_TRY(issue_fetch(T));
      }
      FERRY_TRY(clock_->window_end());
    }
  }
  FERRY_TRY(compute_->embed_backward(globals_grad_.embed, b));
  FERRY_TRY(streamer_->finish());
  // The next micro-batch reads these gradients back (or the optimizer does).
  FERRY_TRY(timed_wait([&] { return drain_->flush(); }));
  if (arena_->bf16_grads()) {
    // The globals' running sum is rounded after every micro-batch too (it stays on the device in
    // between), as the in-memory executor rounds every gradient; in chunks through a layer slot's
    // bf16 twin, free once the drain has flushed (no globals-sized twin: 0.6 GB for 3B's tied
    // embedding), each chunk going to the host on the last micro-batch (stream order keeps the
    // copy ahead of the next chunk's rounding).
    float* gg = dev(plan_.globals_g);
    void* twin = device_.data(plan_.grad16[0]);
    const std::int64_t n = arena_->unit_elements(G), chunk = arena_->max_layer_elements();
    for (std::int64_t off = 0; off < n; off += chunk) {
      const std::int64_t m = std::min(chunk, n - off);
      FERRY_TRY(round_to_bf16(gg + off, twin, m, true));
      if (last) {
        FERRY_TRY(copy(arena_->grads16(G) + off, twin, static_cast<std::size_t>(m) * 2,
                       mem::CopyKind::kDeviceToHost, &globals_grad_d2h_));
      }
    }
  }
  if (last) {
    FERRY_TRY(take_sumsq(G, dev(plan_.globals_g)));
    if (!arena_->bf16_grads()) {
      FERRY_TRY(copy(arena_->grads(G), dev(plan_.globals_g), gbytes, mem::CopyKind::kDeviceToHost,
                     &globals_grad_d2h_));
    }
    FERRY_TRY(read_sumsq());
  }
  // Everything this micro-batch enqueued has run: the caller may reuse its batch, the optimizer
  // may read the gradients, and the clock's events can be read.
  FERRY_TRY(cs().synchronize());
  FERRY_TRY(clock_->collect(&stats_.exposed_s, stats_.window_s, stats_.window_exposed_s));
  stats_.weight_h2d = streamer_->h2d_bytes();
  stats_.grad_d2h = drain_->bytes() + globals_grad_d2h_;
  return r;
}

Result<StepOutcome> StreamExecutor::finish_step(const AdamWConfig& cfg, double lr,
                                                std::int64_t opt_step) {
  if (micro_ != accum_) {
    return invalid_argument("train: finish_step after {} of {} micro-batches", micro_, accum_);
  }
  // The device tail's claims of the previous update are over (its units are, as the forward
  // waited for them) before the CPU worker's range is reset by the next submit, and its
  // pre-staging of this backward has read the arena (queued on a GPU) before the CPU worker may
  // write it; its error, if any.
  if (tail_) FERRY_TRY(tail_->wait());
  StepOutcome o;
  const ClipResult clip = clip_from_partials(sumsq_, accum_, cfg.max_grad_norm);
  o.grad_norm = clip.norm;
  if (!std::isfinite(o.grad_norm)) return o;
  o.clip = clip.clip;
  if (!(cfg.beta1 >= 0.0 && cfg.beta1 < 1.0) || !(cfg.beta2 >= 0.0 && cfg.beta2 < 1.0)) {
    return invalid_argument("train: betas ({}, {}) must lie in [0, 1)", cfg.beta1, cfg.beta2);
  }
  if (opt_step < 1) return invalid_argument("train: AdamW step {} < 1", opt_step);
  const UpdateArgs args{.lr = static_cast<float>(lr),
                        .beta1 = static_cast<float>(cfg.beta1),
                        .beta2 = static_cast<float>(cfg.beta2),
                        .eps = static_cast<float>(cfg.eps),
                        .weight_decay = static_cast<float>(cfg.weight_decay),
                        .grad_scale = static_cast<float>(o.clip / static_cast<double>(accum_)),
                        .step = opt_step,
                        .sr_seed = sr_seed_};
  opt_->submit(args);  // the CPU worker: globals, then layers (from the top with a device tail)
  // The device claims layers from the bottom meanwhile, on its own thread and stream.
  if (tail_) tail_->submit(args);
  if (resident_) {
    // The resident layers in place on the compute stream, ahead of the next forward's kernels
    // (on the emulated tier: run here, on the compute thread).
    FERRY_TRY(resident_->update(args, cs()));
    for (int u = 0; u < resident_->count(); ++u) opt_->mark_external_done(u);
  }
  o.applied = true;
  return o;
}

void StreamExecutor::wait_optimizer() {
  opt_->wait_all();
  // Its error (if any) surfaces at the next micro_batch / finish_step / store_to.
  if (tail_) (void)tail_->wait();
}

Status StreamExecutor::store_to(TrainState& s) {
  wait_optimizer();
  if (tail_) FERRY_TRY(tail_->error());  // a failed unit: the arena is not a consistent step
  // The resident layers' state lives on the device: into the arena first (after their update).
  if (resident_) FERRY_TRY(resident_->download(*te_, cs()));
  return arena_->store_to(s);
}

Status StreamExecutor::load_from(const TrainState& s) {
  wait_optimizer();
  if (tail_) tail_->drop_prestaged();  // staged from the states being replaced
  FERRY_TRY(arena_->load_from(s));
  if (resident_) FERRY_TRY(resident_->upload(*te_, cs()));
  return {};
}

}  // namespace ferry::train::stream
