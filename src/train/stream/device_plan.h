// SPDX-License-Identifier: Apache-2.0
// DevicePlan: every byte the streaming executor holds in the device tier for one micro-batch of
// T tokens, as one mem::ArenaPlan plus the compute workspace (ModelCompute's one-layer
// internals, one dedicated workspace per kept layer of the policy (ModelCompute::kept_layer_bytes
// each), scratch, the loss's logits chunk and the attention backward's dK/dV workspace,
// ModelCompute::planned_bytes with the process default model::AttnBwdWorkspace::kDefault, which
// is what the executor's ModelCompute::create uses, so the plan is exactly what it allocates):
//   globals   embedding / final norm / untied lm_head weights + their gradients (resident)
//   slot.i    prefetch ring of weight slots (each the largest layer)
//   grad.k    two layer-gradient slots (one filled by backward while the other drains), with
//             bf16 gradients each with a bf16 twin the D2H / refill moves (the globals' pass
//             through twin 0 in chunks)
//   boundary  [T, C] f32 per device-homed boundary, x_final, two transit buffers (forward of
//             boundaries kept elsewhere or recomputed, boundary i in transit.(i % 2); transit.1
//             also a backward fetch; each empty when no boundary of the policy needs it), one
//             fetch buffer (host/NVMe boundaries coming back) and one per boundary a recompute
//             span regenerates
//   stage16   bf16 landing buffer for bf16 streaming weights on a GPU (the largest unit; empty on
//             the emulated tier, which widens in place, for f32 streaming weights, and with bf16
//             weight views, where layers land in their slot's twin and the embedding through the
//             globals' gradient region, as the head does)
//   slot16.i  bf16 weight views only (bf16_weights_views(): a GPU, bf16 streaming weights, bf16
//             GEMMs, FERRY_BF16_WEIGHT_VIEWS not 0): each weight slot's bf16 twin (the largest
//             layer's bf16 weights, the arena's layout), which the GEMMs read in place; the f32
//             slot.i then holds only the parameters read as f32 (bf16_widen.h), so it shrinks to
//             the largest layer's f32 part
//   sumsq     [P] f32: each parameter's gradient sum of squares, taken on the device
//   optimizer_tail  the device optimizer tail's staging (device_optimizer_tail.h, with
//             --device-update-layers: --device-update-slots x the largest of its layers' optimizer
//             sections, plus one parameter's f32 widening buffer with bf16 gradients), else 0
//   resident  --resident-layers K: layers 0..K-1's weights, master/Kahan words, AdamW states and
//             gradients, on the device for the whole run (resident_layers.h), else 0
//   batch     a GPU backend's copy of the packed batch (ids, positions, targets [T], cu_seqlens
//             [T + 1] i32); empty for host backends, which read the caller's batch
// The executor allocates exactly this; check_budget() refuses a batch that does not fit before
// training starts, naming the largest batch that would. Tests: stream_executor_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "kernels/backend.h"
#include "mem/arena.h"
#include "model/config.h"
#include "model/model_compute.h"
#include "train/stream/activation_policy.h"

namespace ferry::train::stream {

// FERRY_BF16_WEIGHT_VIEWS: "0" turns bf16 weight views off (the converting path, for A/B); unset
// or anything else leaves them on. Read once per process.
bool bf16_weight_views_default();

struct ModelSizes {
  std::int64_t globals_elements = 0;    // embed + final_norm (+ lm_head when untied)
  std::int64_t max_layer_elements = 0;  // the largest layer's parameters
  std::int64_t params = 0;              // parameter tensors (sums of squares)
  bool bf16_weights = false;            // the arena streams bf16 (bf16 masters)
  bool bf16_grads = false;              // the arena keeps bf16 gradients (grad16 staging)
  // DeviceOptimizerTail::staging_bytes (layers, slots) for --device-update-layers (0: off).
  std::size_t optimizer_tail_bytes = 0;
  // ResidentLayers::bytes for --resident-layers K (0: none resident).
  std::size_t resident_bytes = 0;
  // bf16 weight views asked for (StreamOptions::bf16_weight_views; they apply only where
  // bf16_weight_views() says) and the largest layer's f32 part with them
  // (bf16_view_f32_elements: norms, biases, q/k norms, router, under-aligned matrices).
  bool bf16_weight_views = bf16_weight_views_default();
  std::int64_t max_layer_f32_elements = 0;
};

inline constexpr int kGradSlots = 2;

struct DevicePlan {
  mem::ArenaPlan plan;
  mem::SlotId globals_w, globals_g, x_final, fetch, sumsq, batch;
  mem::SlotId sumsq_ws;        // the backend's sum_squares scratch (0 bytes on the CPU)
  mem::SlotId stage16;         // bf16 landing buffer (bf16_widen.h), maybe 0 bytes
  mem::SlotId optimizer_tail;  // device optimizer tail staging, maybe 0 bytes
  mem::SlotId resident;        // GPU-resident layers (resident_layers.h), maybe 0 bytes
  std::int64_t stage16_elements = 0;
  // Layer GEMM weights read in place from slot16 (bf16_weight_views()); slot.i is then the f32
  // part only.
  bool bf16_weight_views = false;
  std::vector<mem::SlotId> slots;    // [prefetch slots]
  std::vector<mem::SlotId> slots16;  // [prefetch slots]: bf16 twins, 0 bytes without views
  std::vector<mem::SlotId> grads;    // [kGradSlots]
  // bf16 gradients: each gradient slot's bf16 rounding (what leaves for and comes back from the
  // host; the globals go through grad16[0] in chunks); 0 bytes without bf16 gradients.
  std::vector<mem::SlotId> grad16;     // [kGradSlots]
  std::vector<mem::SlotId> boundary;   // [L]: device-homed boundaries (others unused)
  std::vector<mem::SlotId> transit;    // [2]
  std::vector<mem::SlotId> recompute;  // [policy.max_recomputed()]
  std::size_t compute_bytes = 0;       // ModelCompute(work_layers = 1, the kept layers) buffers
  std::size_t kept_bytes = 0;          // of compute_bytes: the kept layers' workspaces
  std::size_t total_bytes() const { return plan.allocation_bytes() + compute_bytes; }
};

// Whether the executor reads layer GEMM weights as bf16 views for these sizes: bf16 streaming
// weights, views asked for, bf16 GEMMs on a GPU backend that multiplies bf16 natively (the CPU
// backend and the emulated tier keep the widened f32 slots).
bool bf16_weight_views(const ModelSizes& sizes, const kernels::Backend& backend,
                       model::GemmPrecision precision);

// The model a device plan's bytes are for, beyond its layer count: the architecture (a per-head
// q/k norm, Qwen3's, adds q_pre / k_pre and their rstd to every layer workspace, each kept layer's
// included: at 3B shapes x 32768 tokens 304 MB a workspace; q/k/v biases) and the shapes. `ferry
// plan` records it in a plan document ("model"), and `ferry bench train` refuses a plan=FILE
// solved for another model, whose GPU bytes and step do not hold for the one it runs (H200,
// session 16: a plan solved for --geometry qwen2.5-3b, Qwen2, fitted 40 GiB at batch 32 by
// 214 MB; the bench's --geometry model, Qwen3 unless --arch qwen2, needed 1.2 GB more there).
Json device_plan_model(const model::ModelConfig& config);
// "" when `planned` (a plan document's "model") and `run` (device_plan_model of the run's model)
// agree; else each field that differs, "model_type qwen2 (this run qwen3), qk_norm ...".
std::string device_plan_model_mismatch(const Json& planned, const Json& run);

// slots >= 2: the weight ring (prefetch depth + the slot in use).
Result<DevicePlan> plan_device(const model::DecoderGeometry& geo, const ModelSizes& sizes,
                               const ActivationPolicy& policy, int slots, std::int64_t tokens,
                               kernels::Backend& backend,
                               model::GemmPrecision precision = model::GemmPrecision::kF32);

// Largest batch b in [1, limit_batch] whose plan (tokens = b * seq_len) fits `budget` bytes;
// 0 when not even b = 1 fits.
Result<int> largest_batch(const model::DecoderGeometry& geo, const ModelSizes& sizes,
                          const ActivationPolicy& policy, int slots, std::int64_t seq_len,
                          std::size_t budget, kernels::Backend& backend,
                          model::GemmPrecision precision = model::GemmPrecision::kF32,
                          int limit_batch = 1 << 16);

// OK when batch * seq_len tokens fit; otherwise resource_exhausted naming what the batch needs,
// the budget, and the largest batch that fits (or that even batch 1 does not).
Status check_budget(const model::DecoderGeometry& geo, const ModelSizes& sizes,
                    const ActivationPolicy& policy, int slots, int batch, std::int64_t seq_len,
                    std::size_t budget, kernels::Backend& backend,
                    model::GemmPrecision precision = model::GemmPrecision::kF32);

}  // namespace ferry::train::stream
