// SPDX-License-Identifier: Apache-2.0
// Fits a plan problem's GPU-memory terms to the byte count of the executor that will run the plan
// (train/stream/device_plan.h), so that a plan which fits the planner's capacity also fits the
// stream executor's device budget. Why: the cost model prices bf16 boundaries and a transformer
// layer's minimal internals, while the executor today keeps f32 boundaries and allocates every
// buffer statically (weight ring, f32 globals and their gradients, transit / fetch / recompute
// buffers, ModelCompute's whole workspace). Measured on the H200 (3B shapes, 24 GB): the
// planner's batch 64 plan needed the executor's bytes of batch 25.
// The fit: boundaries take the executor's f32 size; the per-window working terms are dropped,
// and gpu_fixed_gb becomes the largest gap between the executor's total and the planner's own
// peak (with no fixed term) over the three fixed policies (all on GPU, all in host memory,
// checkpoint every 4). The executor's bytes are linear in the device-homed boundaries, so the
// planner's peak then bounds the executor's bytes for those policies (exactly for the one with
// the largest gap); a mixed plan can still need more (a fetch buffer beside recompute buffers),
// which solve_for_executor checks and corrects.
// (File prefix cmd_plan_: built only with ferry_plan, like the subcommand it serves.)
#pragma once

#include <cstddef>
#include <string>

#include "core/result.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/model_compute.h"
#include "plan/plan.h"
#include "plan/problem.h"
#include "plan/search.h"
#include "train/optim/optim_modes.h"

namespace ferry::app {

struct ExecutorTarget {
  kernels::Backend* backend = nullptr;  // whose workspace sizes the executor will allocate
  model::GemmPrecision precision = model::GemmPrecision::kF32;
  bool bf16_weights = false;  // bf16 weights on the link (bf16 staging buffer on a GPU)
  bool bf16_grads = false;    // bf16 gradients (their bf16 twins on the device)
  int slots = 3;              // weight ring: prefetch depth 2 + the slot in use
  // The device optimizer tail (ferry train --device-update-layers / --device-update-slots): its
  // staging, device_update_slots x the largest of its layers' optimizer sections (+ one
  // parameter's f32 widening buffer with bf16 gradients), is device memory whatever the plan.
  // mode: the sections' sizes (every parameter 8-bit in 8bit mode: no --8bit-params subset).
  train::OptimMode mode;
  int device_update_layers = 0;  // 0: off; K; train::stream::kDeviceUpdateAllLayers: every layer
  int device_update_slots = 2;
};

// DeviceOptimizerTail::staging_bytes on the layout of the arena ferry train would build for cfg
// and t (train::stream::arena_layout_for: nothing allocated); 0 with the tail off. With
// `resident` GPU-resident layers the tail works on the layers above them (none left: 0).
std::size_t device_tail_staging_bytes(const model::ModelConfig& cfg, const ExecutorTarget& t,
                                      int resident = 0);

// ResidentLayers::layer_bytes of decoder layer u on that layout (bf16 weight views as the
// executor on t.backend would use them). Every parameter's states 8-bit in 8bit mode (no
// --8bit-params subset), as the tail's staging.
std::size_t resident_layer_bytes(const model::ModelConfig& cfg, const ExecutorTarget& t, int u);
// ResidentLayers::scratch_bytes for k resident layers on that layout.
std::size_t resident_scratch_bytes(const model::ModelConfig& cfg, const ExecutorTarget& t, int k);

// device: "cuda", "cpu" or "auto" (cuda when a GPU is present, else cpu); master: ferry train's
// --master (bf16 masters stream bf16 weights; an fp32 master streams bf16 on a GPU, auto).
Result<ExecutorTarget> executor_target(const std::string& device, const std::string& master,
                                       bool bf16_grads = false);

// Rewrites p's GPU-memory terms (boundary_gb, work_*_gb, loss_work_gb, gpu_fixed_gb, each
// layer's resident_gb: resident_layer_bytes, and device_update_staging_gb: t's device tail
// staging, counted by the planner at K > 0 only) for the executor at p.batch_size x p.seq_len
// tokens.
// Timings and the other tiers are untouched.
Status fit_gpu_memory_to_executor(plan::PlanProblem& p, const model::ModelConfig& cfg,
                                  const ExecutorTarget& t);

// The executor's device bytes (GB) for a plan's boundary homes at p's batch, its resident layers'
// (p.resident_layers) included, and t's device tail staging (callers pass t with the problem's
// tail: device_tail_layers(p)).
Result<double> executor_gpu_gb(const plan::PlanProblem& p, const plan::Plan& plan,
                               const model::ModelConfig& cfg, const ExecutorTarget& t);

// Solves p with `solve`, then checks the solution against the executor's own byte count: a mixed
// plan (host homes and recompute spans together) can need a fetch buffer beside the recompute
// buffers, which no fixed policy of the fit has. While the executor's bytes exceed the cap, the
// planner's cap is lowered by the overshoot and p solved again (a few rounds). The fixed
// policies, priced without the cap and checked against the executor's bytes, are candidates too
// (the fitted fixed term is the largest gap over them, so the cost model alone can refuse one the
// executor holds): the result is the best predicted step among what the executor holds (policy
// "solved"; solver.status "fixed_kept:<name>" when a fixed policy won). resource_exhausted when
// nothing fits (the cost model's own message, naming the binding constraint, when it had one).
Result<plan::Plan> solve_for_executor(const plan::PlanProblem& p, const plan::Planner& solve,
                                      const model::ModelConfig& cfg, const ExecutorTarget& t);

}  // namespace ferry::app
