// SPDX-License-Identifier: Apache-2.0
// PlanProblem: everything the activation planner needs to know about one training step, as numbers
// (no model or machine objects): per-layer compute times, per-boundary activation bytes, per-layer
// weight and gradient bytes, link and NVMe rates, memory capacities and the fixed memory each tier
// needs whatever the plan. The analytic cost model (cost_model.h) or a measured profile
// (profile.h) fills it; the MILP (milp.h), the exact solver (exact.h), the fixed policies
// (policies.h) and the evaluator (evaluate.h) all read the same struct, so they price a plan
// identically.
//
// Units: bytes in GB (1e9 bytes), times in ms, rates in GB/s. Keeping the numbers O(1e-3..1e3)
// keeps CBC's tolerances meaningful (bytes as 1e10 would make 1e-6 feasibility slack ~10 kB).
//
// The step as a sequence of 2L+1 compute windows (window index t):
//   t = j          forward of layer j            (j = 0..L-1)
//   t = L          loss: final norm + lm_head + chunked cross-entropy, forward and backward
//   t = 2L - j     backward of layer j           (j = L-1..0), incl. re-forward of its internals
//                  (internals-only: a dense layer's forward without its MLP down projection and
//                  residual add; skipped when the plan keeps layer j's internals:
//                  Plan::keep_internals)
// Boundary i (i = 0..L) is the input of layer i (boundary L feeds the loss); it is produced at the
// end of window i-1 (boundary 0: before the step, by the embedding) and last read by the backward
// of layer i (boundary L: by the loss window). Boundaries 0..L-1 may be homed off the GPU (their
// transfers then run in windows, boundary 0's from window 0 on); boundary L stays on the GPU.
#pragma once

#include <string>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "core/status.h"

namespace ferry::plan {

struct LayerCost {
  double fwd_ms = 0;       // forward of the layer in the forward pass
  double bwd_ms = 0;       // backward incl. re-forward of the layer's internals from its input
                           // (internals-only: cost_model.h reforward_flop_share)
  double rec_ms = 0;       // full forward of the layer when recomputing a span in backward
  double weight_gb = 0;    // bf16 weights streamed host->GPU for each use
  double grad_gb = 0;      // gradients streamed GPU->host after the layer's backward
  double work_fwd_gb = 0;  // transient GPU memory of the forward (internals, not kept)
  double work_bwd_gb = 0;  // transient GPU memory of the backward (re-forwarded internals + grads)
  // The CPU update of this layer's parameters, measured (a profile's per-unit optimizer time);
  // 0 on every layer: cpu_optimizer_ms split by weight instead (optimizer_ready_ms).
  double optimizer_ms = 0;
  // Keeping the layer's internals (issue #7, docs/plan.md "keep internals"): the forward of the
  // layer leaves what its backward reads in GPU memory from its forward window j through its
  // backward window 2L-j, and the backward skips its re-forward.
  double internals_gb = 0;   // GPU bytes of the kept internals (cost_model.h kept_internals_gb)
  double keep_saved_ms = 0;  // backward time saved when kept: the internals-only re-forward
                             // (dense: ~0.71 x rec_ms at Qwen2.5-3B/7B, seq 1024; MoE: ~rec_ms),
                             // <= bwd_ms; 0: keeping never helps, so the layer has no keep choice
  // GPU-resident layers (PlanProblem::resident_layers, docs/plan.md "resident layers"): the device
  // bytes the layer takes when resident (weights, master, AdamW states, gradients in the
  // executor's layout: ResidentLayers::layer_bytes, which ferry plan calls on the layout of the
  // arena the run would build: cmd_plan_executor_fit.h). 0 with
  // resident_layers > j: the layer is resident for free (a test problem's choice).
  double resident_gb = 0;
};

struct LinkRates {
  double h2d_gbps = 0;            // pinned host->GPU alone
  double d2h_gbps = 0;            // pinned GPU->host alone
  double duplex_gbps = 0;         // both directions at once, sum of the two
  double duplex_loaded_gbps = 0;  // both directions while the CPU optimizer streams host memory
  double nvme_read_gbps = 0;
  double nvme_write_gbps = 0;
};

struct PlanProblem {
  int num_layers = 0;               // L
  std::vector<double> boundary_gb;  // [L+1] A_i: activation bytes of boundary i
  std::vector<LayerCost> layers;    // [L]
  double loss_ms = 0;               // the loss window's compute (lm_head fwd+bwd, CE)
  double loss_work_gb = 0;          // GPU memory of the loss window: logits chunk, lm_head w+grad
  double head_weight_gb = 0;        // lm_head (+ final norm) weights, H2D before the loss window
  double head_grad_gb = 0;          // their gradients, D2H after the loss window
  double step_fixed_ms = 0;         // serial work no window hides (embedding, first weights,
                                    // last gradients, optimizer of layer 0, step start/stop)
  double cpu_optimizer_ms = 0;      // the CPU optimizer's work per step; it overlaps the GPU
                                    // windows, so the step is never shorter than this
  // Measured per-step cost of boundaries homed off the GPU (docs/plan.md, "the host-home term"):
  // ms per GB of boundary bytes (boundary_gb, one copy; each moves out and back) homed in host
  // memory or on NVMe (whose bytes pass through host memory too), added serially to the step
  // (Prediction::host_home_ms) whether or not the transfers hide in compute windows: the DMA
  // traffic competes with the CPU optimizer for host memory bandwidth (measured on an H200 at
  // Qwen2.5-3B: +126 ms per step for 9.7 GB homed). Constant per GB at any batch; 0: not measured
  // (an older profile, or the analytic model), the transfers are then free when hidden.
  double host_home_ms_per_gb = 0;
  // Measured per-step saving of each GPU-resident layer beyond what the model predicts for it
  // (docs/plan.md, "the resident-saving term"): ms per layer per step, x resident_layers,
  // subtracted from the step (Prediction::resident_saved_ms). The profile's windows are measured
  // with every layer streamed, so whatever streaming costs a layer beside its modelled transfers
  // and optimizer gate (its CPU update and weight / gradient traffic sharing the host with the
  // step) is in them; a resident layer does not pay it. Fitted from a device run at K = 0 and one
  // with resident layers at the same batch (H200, Qwen2.5-3B, session 17: K = 16 -> 27 measured
  // ~100 ms faster where the model saw no difference). Not scaled with the batch; 0: not measured.
  double resident_saved_ms = 0;
  LinkRates link;

  // Capacities and the bytes each tier needs whatever the plan.
  double gpu_cap_gb = 0;
  double host_cap_gb = 0;
  double nvme_cap_gb = 0;    // 0: no NVMe tier
  double gpu_fixed_gb = 0;   // CUDA context + workspace + weight/gradient stream buffers
  double host_fixed_gb = 0;  // host-resident model state (weights, master, optimizer, grads)

  // The executor's device optimizer tail (`--device-update-layers`, docs/train_gpu_executor.md
  // item 5): the GPU updates layers 0, 1, ... (at most K) while the CPU worker, after the globals,
  // updates L-1, L-2, ... until they meet. 0: off (the CPU updates every layer); K > L is read
  // as L (all). device_update_ms_per_layer: the device's time per layer, measured; 0: derived
  // (device_update_layer_ms).
  int device_update_layers = 0;
  double device_update_ms_per_layer = 0;
  // The bytes the tail moves host->device per layer it updates (its optimizer sections and
  // gradients), GB: measured (a bench report's device_update_h2d_bytes per unit) or 0: derived as
  // the layer's share of host_fixed_gb (device_tail_layer_h2d_gb). They share the link with the
  // forward's weight stream (device_tail_h2d_gb: charged to the forward windows), and with
  // device_update_ms_per_layer 0 they also give the device's time per layer (over the H2D rate).
  double device_update_h2d_gb_per_layer = 0;
  // The tail's GPU memory: its staging (the executor's DeviceOptimizerTail::staging_bytes, slots x
  // the largest of its layers' optimizer sections), the same for every K > 0 and nothing at K = 0
  // (device_tail_gpu_gb), counted in every window beside gpu_fixed_gb. 0: not separated (a problem
  // whose gpu_fixed_gb holds it, or no executor target). The tail search (device_tail.h) needs it
  // apart: K = 0 then fits where a K > 0 may not.
  double device_update_staging_gb = 0;

  // GPU-resident layers (`ferry train --resident-layers K`, train/stream/resident_layers.h):
  // layers 0..K-1 keep weights, master, states and gradients on the GPU for the whole run. Such a
  // layer streams no weights (no H2D in any window, recompute included), drains no gradients (no
  // D2H), costs the CPU optimizer nothing, and is updated in place on the GPU once the clip scale
  // is known, before the next forward (serial: resident_update_layer_ms). Its bytes
  // (LayerCost::resident_gb) are GPU memory in every window. The solvers price a problem at its
  // K; the search over K is an outer loop (resident.h). 0: none (the default; JSON without the
  // key). K > L is read as L.
  int resident_layers = 0;
  // The GPU update of one resident layer, ms; 0: derived (resident_update_layer_ms).
  double resident_update_ms_per_layer = 0;

  int max_span = 4;  // R: a recomputed span covers at most R-1 layers between boundaries
  // Whether the solvers may keep a layer's internals (keep_allowed). false gives exactly the plans
  // of a planner without the choice. A problem JSON without the key (written before the choice
  // existed) reads as false, so an old document solves to its old plan.
  bool allow_keep_internals = true;
  // Tie-breaker on moved bytes (ms per GB moved) so equal-time plans prefer moving less. Part of
  // the objective of every solver, so exact and MILP optima stay comparable.
  double move_penalty_ms_per_gb = 1e-4;

  // Metadata (not used by the solvers): what the numbers describe.
  int batch_size = 0;
  int seq_len = 0;
  double model_flops_per_step = 0;  // 6 * N * B * S: the anchors' TFLOPS convention
  std::string source;               // "analytic:<machine>" or "profile:<path>"

  int num_windows() const { return 2 * num_layers + 1; }
  int fwd_window(int layer) const { return layer; }
  int loss_window() const { return num_layers; }
  int bwd_window(int layer) const { return 2 * num_layers - layer; }
  bool has_nvme() const { return nvme_cap_gb > 0 && link.nvme_read_gbps > 0; }
};

// Layer j's keep-internals choice exists: allow_keep_internals and keep_saved_ms > 0 (a keep that
// saves nothing is never offered, so equal-cost ties cannot keep bytes for nothing).
inline bool keep_allowed(const PlanProblem& p, int j) {
  return p.allow_keep_internals && p.layers[j].keep_saved_ms > 0;
}

// "f3", "loss", "b3": a window's short name for tables and messages.
std::string window_name(const PlanProblem& p, int t);
// "forward of layer 3", "the loss window", "backward of layer 3".
std::string window_description(const PlanProblem& p, int t);

// The CPU optimizer gate (docs/plan.md, "the optimizer gate"). The previous step's update can
// only start once the clip scale is known, i.e. after the backward of layer 0 (the last gradient);
// it then updates the layers in the next forward's order, each in proportion to its weights
// (AdamW streams every parameter's master, states and gradient once: linear in parameters), so
// layer j's update takes cpu_optimizer_ms * W_j / sum_k W_k, or its measured optimizer_ms when
// every layer has one (the split smears the globals' update, which runs first, over the
// layers: at a 152k vocabulary that is ~15 % of a 7B model's parameters). Layer 0's share is serial
// (step_fixed_ms). Returns [L] U_j: when layer j's update is done, in ms after the forward of
// layer 0 starts (U_0 = 0); the forward of layer j cannot start before U_j.
//
// With the device tail on (device_update_layers > 0) the phase is simulated: both sides start at
// the same point, the CPU after its globals (measured: cpu_optimizer_ms minus the layers' times;
// split by weight: none, they are smeared as above), the device claims the lowest unclaimed layer
// whenever it is free (at most K), the CPU the highest; a layer is ready when its claimer finishes
// it. U_j is then layer j's ready time minus layer 0's (same time base: the forward of layer 0
// starts once layer 0 is ready, U_0 = 0). With device_update_layers = 0 the values are exactly the
// CPU-only ones above.
std::vector<double> optimizer_ready_ms(const PlanProblem& p);

// How long the optimizer phase takes per step, the floor of the step (evaluate.cpp, the MILP's
// bound row): cpu_optimizer_ms without the device tail (exactly); with it, when the later of the
// two sides finishes (the CPU does only its share of the layers).
double optimizer_phase_ms(const PlanProblem& p);

// The device tail's time for layer j: device_update_ms_per_layer when > 0, else its H2D bytes
// (device_tail_layer_h2d_gb) over the H2D rate.
double device_update_layer_ms(const PlanProblem& p, int j);
// The tail's H2D bytes for layer j: device_update_h2d_gb_per_layer when > 0, else the layer's
// share of the host model state (host_fixed_gb by weight over the layers and the head).
double device_tail_layer_h2d_gb(const PlanProblem& p, int j);
// The tail's link traffic (docs/plan.md, "the tail on the link"): [2L+1] GB of H2D per window,
// beside the window's own transfers. The tail's units run from the clip point; each layer j > 0
// the device claims (the simulation of optimizer_ready_ms decides which) has its bytes charged to
// the forward window f(j-1), the window that runs beside that unit when the forward follows the
// device (f(j-1) starts at U_(j-1), when unit j-1 is done and unit j begins) and that prefetches
// layer j's weights on the same link. Layer 0's unit (j = 0) runs before the forward, in the
// serial part (device_tail_serial_ms). Zero everywhere without a tail; the same constants for
// every plan, so the evaluator and the MILP add them alike.
std::vector<double> device_tail_h2d_gb(const PlanProblem& p);
// The serial change of the step with the tail on and no resident layers: the device updates
// layer 0 (device_update_layer_ms(p, 0)) before the forward where step_fixed_ms holds layer 0's
// CPU share: that time minus min(layer 0's CPU share, step_fixed_ms); 0 otherwise (no tail, or
// resident layers: resident_serial_ms replaces layer 0's share and the tail starts above them).
double device_tail_serial_ms(const PlanProblem& p);
// The layers the tail may update: min(device_update_layers, L - resident layers), >= 0.
int device_tail_layers(const PlanProblem& p);
// The tail's GPU bytes in every window: device_update_staging_gb when it updates a layer, else 0.
double device_tail_gpu_gb(const PlanProblem& p);

// Resident layers (resident_layers): K clamped to [0, L]; the weight bytes layer j streams (0
// when resident); the gradient bytes it drains (0 when resident); the resident bytes on the GPU
// in every window; the GPU update time of resident layer j (resident_update_ms_per_layer, else
// ASSUMED kResidentUpdateMsPerGb x its resident_gb: the device tail's kernels, 0.8 ms per
// Qwen2.5-3B layer on an H200 in the session-16 logs, over that layer's ~0.8 GB of sections); the
// serial change of the step: the K GPU updates run before the next forward where layer 0's CPU
// update was serial (step_fixed_ms holds it), so K x update - layer 0's CPU share (0 at K = 0).
inline constexpr double kResidentUpdateMsPerGb = 1.0;
int resident_count(const PlanProblem& p);
double streamed_weight_gb(const PlanProblem& p, int j);
double drained_grad_gb(const PlanProblem& p, int j);
double resident_gpu_gb(const PlanProblem& p);
double resident_update_layer_ms(const PlanProblem& p, int j);
double resident_serial_ms(const PlanProblem& p);
// The resident-saving term: resident_saved_ms x the resident layers (K).
double resident_saved_total_ms(const PlanProblem& p);

// The NVMe bounce buffer (docs/plan.md, "NVMe staging in host memory"): the stream executor
// allocates one pinned staging record in its host activation arena when any boundary is homed on
// NVMe (StreamExecutor: "nvme_staging", NvmeStore::record_stride() = one boundary's f32 bytes
// rounded up to 4 KiB), and every NVMe store (D2H into it, then the disk write) and fetch (disk
// read into it, then H2D) of the step goes through that one buffer, one boundary at a time. It
// lives for the whole run, not per window or per boundary: host memory once, whenever some
// boundary's home is NVMe. Its size here is the largest boundary that can have an NVMe home
// (0..L-1; the executor's are all one size, B x S x hidden x 4 bytes with the executor fit; the
// 4 KiB rounding is not counted, as for the host homes' slots); 0 without an NVMe tier. The
// evaluator adds it to host_peak_gb, the MILP charges it to the host row through a binary "some
// boundary on NVMe", and the exact solver checks it itself (exact.cpp).
double nvme_bounce_gb(const PlanProblem& p);

// The bounce buffer's timing (docs/plan.md, "NVMe traffic through the bounce buffer"). Every NVMe
// byte passes the one staging record in two legs, back to back (the record holds one boundary,
// so the second leg of a boundary cannot start before the first ends, nor the next boundary's
// first leg before this one's second):
// - a store (StreamExecutor::store_boundary): D2H into the record, then the disk write, while the
//   host thread waits for both before it issues the next forward window. The GPU's compute has
//   nothing queued meanwhile, so no compute hides it: ms per GB = 1e3 (1/d2h + 1/nvme_write), all
//   of it in the forward window that produced the boundary (nvme_store_window) on top of that
//   window's compute;
// - a fetch (StreamExecutor::fetch_into): the disk read into the record, then the H2D: ms per GB
//   = 1e3 (1/nvme_read + 1/h2d), hidden by the compute of the window whose bytes they are, like
//   the link's traffic but not overlapped with itself. The executor reads ahead on a thread of its
//   own (train/stream/nvme_read_ahead.h) from the loss window on, each read as soon as the record
//   is free (the previous fetch's H2D done), so the compute thread goes on queueing meanwhile;
//   until session 36 it read at the fetch's issue point and blocked the host there.
// 0 without an NVMe tier.
double nvme_store_ms_per_gb(const PlanProblem& p);
double nvme_fetch_ms_per_gb(const PlanProblem& p);
// The forward window whose end an NVMe store of boundary i waits at: the one that produced it,
// f(i-1); boundary 0 (the embedding's output, stored before f0 is issued) counts in f0.
inline int nvme_store_window(const PlanProblem&, int i) { return i > 0 ? i - 1 : 0; }

// Sizes and signs consistent; a non-ok Status names the first bad field.
Status validate(const PlanProblem& p);

Json to_json(const PlanProblem& p);
// The problem document's "link" object (to_json above; `ferry plan --evaluate` writes its rates
// in the same form).
Json to_json(const LinkRates& r);
// `ferry plan --link-gbps X`, a what-if link: h2d = d2h = X, full duplex 1.8X, duplex while the
// CPU optimizer streams host memory 1.5X; the NVMe rates are left as they are.
void set_symmetric_link(LinkRates& r, double gbps);
Result<PlanProblem> problem_from_json(const Json& j);

}  // namespace ferry::plan
