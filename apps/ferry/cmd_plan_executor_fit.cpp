// SPDX-License-Identifier: Apache-2.0
#include "apps/ferry/cmd_plan_executor_fit.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "core/log.h"
#include "model/model_binding.h"
#include "model/param_spec.h"
#include "plan/policies.h"
#include "train/optim/optim_modes.h"
#include "train/optim/optim_state.h"
#include "train/stream/activation_policy.h"
#include "train/stream/arena_layout.h"
#include "train/stream/bf16_widen.h"
#include "train/stream/device_optimizer_tail.h"
#include "train/stream/device_plan.h"
#include "train/stream/resident_layers.h"
#include "train/stream/stream_executor.h"

namespace ferry::app {
namespace {

constexpr double kGB = 1e9;  // the planner's unit

train::stream::Home executor_home(plan::Home h) {
  switch (h) {
    case plan::Home::kGpu:
      return train::stream::Home::kDevice;
    case plan::Home::kHost:
      return train::stream::Home::kHost;
    case plan::Home::kNvme:
      return train::stream::Home::kNvme;
    case plan::Home::kRecompute:
      return train::stream::Home::kRecompute;
  }
  return train::stream::Home::kDevice;
}

// The host arena ferry train (and ferry bench train) would build for cfg in t's mode: its layout
// only, nothing allocated. GPU-resident layers and the device tail are sized from it by the
// executor's own functions.
train::stream::ArenaLayout arena_of(const model::ModelConfig& cfg, const ExecutorTarget& t) {
  Result<train::stream::ArenaLayout> a =
      train::stream::arena_layout_for(cfg, t.mode, t.bf16_weights, t.bf16_grads);
  FERRY_CHECK(a.ok(), "plan: arena layout of a validated config: {}", a.status().to_string());
  return std::move(a).value();
}

// The executor's ModelSizes for t, with the device tail's staging (its layers above the
// `resident` GPU-resident ones).
train::stream::ModelSizes executor_sizes(const model::ModelConfig& cfg, const ExecutorTarget& t,
                                         int resident = 0) {
  train::stream::ModelSizes sizes = train::stream::model_sizes(cfg, t.bf16_weights, t.bf16_grads);
  sizes.optimizer_tail_bytes = device_tail_staging_bytes(cfg, t, resident);
  return sizes;
}

}  // namespace

std::size_t device_tail_staging_bytes(const model::ModelConfig& cfg, const ExecutorTarget& t,
                                      int resident) {
  // The executor's own count (DeviceOptimizerTail::staging_bytes) on the layout of the arena
  // ferry train would build; tests/cli/plan_tail.sh checks it against ferry bench train's
  // device_planned_bytes.
  if (t.device_update_layers == 0 || t.device_update_slots <= 0) return 0;
  const train::stream::ArenaLayout arena = arena_of(cfg, t);
  const int layers = arena.globals_unit();
  // The tail claims layers resident, resident + 1, ... (DeviceOptimizerTail's `first`).
  const int first = std::clamp(resident, 0, layers);
  const int units = t.device_update_layers == train::stream::kDeviceUpdateAllLayers
                        ? layers - first
                        : std::min(t.device_update_layers, layers - first);
  if (units <= 0) return 0;
  return train::stream::DeviceOptimizerTail::staging_bytes(arena, units, t.device_update_slots,
                                                           first);
}

std::size_t resident_layer_bytes(const model::ModelConfig& cfg, const ExecutorTarget& t, int u) {
  // The views depend on the weights' dtype and the backend only: the model's sizes without the
  // tail's staging (executor_sizes would lay the arena out a second time for a term not read).
  const bool views =
      t.backend != nullptr &&
      train::stream::bf16_weight_views(
          train::stream::model_sizes(cfg, t.bf16_weights, t.bf16_grads), *t.backend, t.precision);
  return train::stream::ResidentLayers::layer_bytes(arena_of(cfg, t), u, views);
}

std::size_t resident_scratch_bytes(const model::ModelConfig& cfg, const ExecutorTarget& t, int k) {
  if (k <= 0) return 0;
  return train::stream::ResidentLayers::scratch_bytes(arena_of(cfg, t), k);
}

Result<ExecutorTarget> executor_target(const std::string& device, const std::string& master,
                                       bool bf16_grads) {
  ExecutorTarget t;
  if (device != "auto" && device != "cpu" && device != "cuda") {
    return invalid_argument("plan: executor device {} (expected auto, cpu or cuda)", device);
  }
  t.backend = &kernels::cpu_backend();
  if (device != "cpu") {
    auto cuda = kernels::cuda_backend(0);
    if (cuda.ok()) {
      t.backend = *cuda;
    } else if (device == "cuda") {
      return cuda.status();
    }
  }
  FERRY_ASSIGN_OR_RETURN(t.precision, model::parse_gemm_precision("auto", t.backend->device()));
  bool bf16_master = false;
  if (!master.empty()) {
    FERRY_ASSIGN_OR_RETURN(const train::MasterWeights m, train::parse_master_weights(master));
    bf16_master = m != train::MasterWeights::kF32;
    t.mode.master = m;
  }
  // An fp32 master streams its bf16 rounding on a GPU (--weights-dtype auto).
  t.bf16_weights = bf16_master || t.backend->device() != Device::kCpu;
  t.bf16_grads = bf16_grads;
  return t;
}

Status fit_gpu_memory_to_executor(plan::PlanProblem& p, const model::ModelConfig& cfg,
                                  const ExecutorTarget& t) {
  if (t.backend == nullptr) return invalid_argument("plan: no executor backend to fit");
  FERRY_ASSIGN_OR_RETURN(const model::DecoderGeometry geo, model::make_geometry(cfg));
  if (geo.layers != p.num_layers) {
    return invalid_argument("plan: executor fit for {} layers, problem has {}", geo.layers,
                            p.num_layers);
  }
  const std::int64_t tokens = static_cast<std::int64_t>(p.batch_size) * p.seq_len;
  // The device tail's staging apart (device_update_staging_gb: GPU memory at K > 0 only, so that
  // the tail search can fall back to K = 0), sized for t's tail over all layers (the tail search
  // asks t's K = all; for a model of alike layers the staging is the same for any K > 0). The
  // fixed term below is fitted without it: the executor's bytes are the sum of its slots.
  ExecutorTarget no_tail = t;
  no_tail.device_update_layers = 0;
  const train::stream::ModelSizes sizes = executor_sizes(cfg, no_tail);
  // The executor's boundary: f32 hidden states of every token.
  const double a = static_cast<double>(tokens) * static_cast<double>(geo.hidden) * 4.0 / kGB;
  p.boundary_gb.assign(static_cast<std::size_t>(p.num_layers) + 1, a);
  for (plan::LayerCost& l : p.layers) l.work_fwd_gb = l.work_bwd_gb = 0;
  // A kept layer costs the executor exactly its dedicated workspace (ModelCompute's size table:
  // planned_bytes grows by kept_layer_bytes per kept layer), whatever else the plan holds.
  for (int l = 0; l < p.num_layers; ++l) {
    FERRY_ASSIGN_OR_RETURN(const std::size_t kept, model::ModelCompute::kept_layer_bytes(
                                                       geo, l, tokens, *t.backend, t.precision));
    p.layers[static_cast<std::size_t>(l)].internals_gb = static_cast<double>(kept) / kGB;
  }
  p.loss_work_gb = 0;
  p.gpu_fixed_gb = 0;
  for (int l = 0; l < p.num_layers; ++l) {
    p.layers[static_cast<std::size_t>(l)].resident_gb =
        static_cast<double>(resident_layer_bytes(cfg, t, l)) / kGB;
  }
  // The bf16 rounding scratch (one, sized by the largest resident layer) is charged to layer 0,
  // resident whenever any layer is: exact for models whose layers are alike, an under-count by
  // the size difference otherwise (executor_gpu_gb and the executor check use the exact bytes).
  p.layers[0].resident_gb += static_cast<double>(resident_scratch_bytes(cfg, t, 1)) / kGB;

  // The planner's peak of each fixed policy with no fixed term, under no GPU cap.
  plan::PlanProblem probe = p;
  probe.gpu_cap_gb = std::numeric_limits<double>::max() / 4;
  const std::pair<const char*, const char*> policies[] = {
      {"device", "all-gpu"}, {"host", "all-host"}, {"every:4", "checkpoint-every-4"}};
  double fixed = 0;
  for (const auto& [executor_name, planner_name] : policies) {
    // A policy this depth cannot spell (every:4 of a shallow model) or the host tier cannot hold
    // says nothing here; all-gpu always prices.
    auto pol = train::stream::parse_policy(executor_name, geo.layers);
    auto fp = plan::fixed_policy_by_name(planner_name, p.num_layers);
    if (!pol.ok() || !fp.ok()) continue;
    FERRY_ASSIGN_OR_RETURN(
        const train::stream::DevicePlan d,
        train::stream::plan_device(geo, sizes, *pol, t.slots, tokens, *t.backend, t.precision));
    auto priced = plan::solve_policy(probe, *fp);
    if (!priced.ok()) continue;
    fixed =
        std::max(fixed, static_cast<double>(d.total_bytes()) / kGB - priced->predicted.gpu_peak_gb);
  }
  p.gpu_fixed_gb = fixed;
  p.device_update_staging_gb = static_cast<double>(device_tail_staging_bytes(cfg, t)) / kGB;
  return plan::validate(p);
}

Result<double> executor_gpu_gb(const plan::PlanProblem& p, const plan::Plan& plan,
                               const model::ModelConfig& cfg, const ExecutorTarget& t) {
  FERRY_ASSIGN_OR_RETURN(const model::DecoderGeometry geo, model::make_geometry(cfg));
  if (static_cast<int>(plan.homes.size()) != geo.layers + 1) {
    return invalid_argument("plan: {} boundary homes for {} layers", plan.homes.size(), geo.layers);
  }
  train::stream::ActivationPolicy pol;
  for (int i = 0; i < geo.layers; ++i) pol.homes.push_back(executor_home(plan.homes[i]));
  if (plan.num_kept() > 0) {
    pol.keep.assign(static_cast<std::size_t>(geo.layers), false);
    for (int l = 0; l < geo.layers; ++l) pol.keep[static_cast<std::size_t>(l)] = plan.keeps(l);
  }
  pol.nvme_dir = "nvme";  // only its presence matters to the byte count
  const int resident = plan::resident_count(p);
  train::stream::ModelSizes sizes = executor_sizes(cfg, t, resident);
  for (int u = 0; u < resident; ++u) sizes.resident_bytes += resident_layer_bytes(cfg, t, u);
  sizes.resident_bytes += resident_scratch_bytes(cfg, t, resident);
  FERRY_ASSIGN_OR_RETURN(
      const train::stream::DevicePlan d,
      train::stream::plan_device(geo, sizes, pol, t.slots,
                                 static_cast<std::int64_t>(p.batch_size) * p.seq_len, *t.backend,
                                 t.precision));
  return static_cast<double>(d.total_bytes()) / kGB;
}

Result<plan::Plan> solve_for_executor(const plan::PlanProblem& p, const plan::Planner& solve,
                                      const model::ModelConfig& cfg, const ExecutorTarget& t) {
  constexpr int kRounds = 4;
  plan::PlanProblem q = p;
  double need = 0, smallest = std::numeric_limits<double>::infinity();
  std::optional<plan::Plan> best;
  std::optional<Status> model_refusal;  // the cost model's own "does not fit" at the real cap
  for (int round = 0; round < kRounds; ++round) {
    Result<plan::Plan> r = solve(q);
    if (!r.ok()) {
      const StatusCode code = r.status().code();
      if (code != StatusCode::kResourceExhausted && code != StatusCode::kDeadlineExceeded) {
        return std::move(r).take_status();
      }
      // The lowered cap holds no plan of the cost model: the fixed policies below may.
      if (round == 0) model_refusal = std::move(r).take_status();
      break;
    }
    FERRY_ASSIGN_OR_RETURN(need, executor_gpu_gb(p, *r, cfg, t));
    smallest = std::min(smallest, need);
    if (need <= p.gpu_cap_gb) {
      best = std::move(r).value();
      break;
    }
    q.gpu_cap_gb -= need - p.gpu_cap_gb;
    if (!(q.gpu_cap_gb > p.gpu_fixed_gb)) break;
  }
  // The fixed policies as the executor holds them are candidates too: the fit's fixed term is the
  // largest gap over them, so the cost model can refuse one the executor holds (H200, 3B at 24 GB:
  // the planner's largest batch 34 where all-host ran at 38), and lowering the cap for a mixed
  // plan can leave none. The solution is the best predicted step among what the executor holds.
  plan::PlanProblem uncapped = p;
  uncapped.gpu_cap_gb = std::numeric_limits<double>::max() / 4;
  for (const plan::FixedPolicy& pol : plan::fixed_policies(p.num_layers)) {
    Result<plan::Plan> r = plan::solve_policy(uncapped, pol);
    if (!r.ok()) continue;  // another tier's capacity (host, NVMe) or a depth it cannot spell
    FERRY_ASSIGN_OR_RETURN(const double gb, executor_gpu_gb(p, *r, cfg, t));
    smallest = std::min(smallest, gb);
    if (gb > p.gpu_cap_gb) continue;
    if (best && !(r->predicted.step_ms < best->predicted.step_ms)) continue;
    plan::Plan fixed = std::move(r).value();
    fixed.policy = "solved";
    fixed.solver.status = "fixed_kept:" + pol.name;  // beat (or replaced) the MILP's plan
    fixed.predicted.gpu_peak_gb = gb;  // the executor's bytes, not the uncapped model's
    log::get("plan")->debug("plan at batch {}: {} as the executor holds it ({:.2f} GB) is the best",
                            p.batch_size, pol.name, gb);
    best = std::move(fixed);
  }
  if (best) return std::move(*best);
  // It names the binding constraint and the smallest budget that fits.
  if (model_refusal) return std::move(*model_refusal);
  return resource_exhausted(
      "plan: no plan at batch {} that the stream executor holds in {:.2f} GB of GPU memory (the "
      "smallest one tried needs {:.2f} GB as the executor allocates it)",
      p.batch_size, p.gpu_cap_gb, smallest);
}

}  // namespace ferry::app
