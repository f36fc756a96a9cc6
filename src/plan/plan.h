// SPDX-License-Identifier: Apache-2.0
// Plan: the activation policy of one training step as data — for every layer boundary its home
// (GPU, host, NVMe) or "recompute", the recompute spans (the path of materialized boundaries, and
// per span whether the span's weights are re-streamed or kept on the GPU between recompute and
// backward), per layer whether its internals are kept on the GPU from its forward to its backward
// (which then skips its re-forward), and every activation transfer as (boundary, window,
// direction, tier, bytes). Solvers write it, the evaluator (evaluate.h) prices it, plan_json.h
// stores it, and the streaming executor follows its boundary homes (train/stream/plan_policy.h;
// weight-keeping spans and the per-window transfer schedule not yet). Fixed policies are Plans too
// (they keep no internals).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::plan {

enum class Home : std::uint8_t { kGpu, kHost, kNvme, kRecompute };
std::string_view to_string(Home h);

// Path edge (start, end): boundaries start and end materialized, the layers start..end-1 between
// them run forward again inside the backward of layer end-1 (end - start >= 2), on weights that
// are re-streamed (keep_weights = false) or streamed once for the recompute and kept on the GPU
// until their own backward (keep_weights = true). end - start == 1: nothing is recomputed.
struct Span {
  int start = 0;
  int end = 1;
  bool keep_weights = false;
  bool operator==(const Span&) const = default;
};

struct Transfer {
  int boundary = 0;
  int window = 0;
  bool to_gpu = false;  // true: H2D (bringing it back); false: D2H (offloading)
  bool nvme = false;    // true: the host side is the NVMe store (bounced through pinned memory)
  double gb = 0;
  bool operator==(const Transfer&) const = default;
};

// What a plan costs under a PlanProblem (filled by evaluate()).
struct Prediction {
  double gpu_step_ms = 0;  // compute + exposed transfers + step_fixed + resident_serial_ms +
                           // device_tail_serial_ms
  // max(gpu_step_ms + optimizer_wait_ms, optimizer phase) + host_home_ms - resident_saved_ms
  double step_ms = 0;
  // Forward windows held back by the CPU optimizer: the update of the previous step runs layer by
  // layer from the step's start (units in forward order) and layer i's forward needs layer i's
  // update (the executor's LayerOptimizer gate); beyond the layer-0 update step_fixed_ms counts.
  double optimizer_wait_ms = 0;
  // step_ms - gpu_step_ms - optimizer_wait_ms: the GPU done with the step but the CPU optimizer
  // not (its whole update is longer than the GPU's step); 0 unless the optimizer bounds the step.
  double optimizer_bound_ms = 0;
  // PlanProblem::host_home_ms_per_gb x the GB of boundaries homed in host memory or on NVMe: the
  // measured serial cost of off-GPU homes (host memory bandwidth shared with the CPU optimizer),
  // added to the step after the optimizer's max. 0 without the measured term.
  double host_home_ms = 0;
  // PlanProblem::resident_saved_ms x the GPU-resident layers: the measured saving of a resident
  // layer beyond its modelled transfers and update (the profile's windows were measured with it
  // streamed), subtracted after the optimizer's max. 0 without the measured term.
  double resident_saved_ms = 0;
  double compute_ms = 0;  // sum of window compute, incl. recompute
  double recompute_ms = 0;
  double exposed_ms = 0;  // transfer time no compute hides
  // NVMe traffic through the executor's one bounce buffer (docs/plan.md, "NVMe traffic through
  // the bounce buffer"): the stores' serial time (D2H then disk write, host blocked: in
  // exposed_ms, each in the forward window that produced its boundary, unless that window's link
  // traffic exposes more), and the fetches' busy time of the buffer (disk read then H2D, hidden
  // by the compute of their windows where it can be). 0 without NVMe homes.
  double nvme_store_ms = 0;
  double nvme_fetch_ms = 0;
  double objective_ms = 0;  // step_ms + move penalty on moved_gb + kept_internals_gb (what the
                            // solvers minimize)
  double moved_gb = 0;      // activation + re-streamed weight bytes moved by choice
  // GPU bytes of the kept layers' internals (each held from its forward to its backward window).
  // The move penalty applies to them too: between equally fast plans, keep less.
  double kept_internals_gb = 0;
  // GPU-resident layers (PlanProblem::resident_layers): their bytes (in every window's GPU
  // memory) and the serial change of the step (their GPU updates minus layer 0's CPU share).
  double resident_gb = 0;
  double resident_serial_ms = 0;
  // The device optimizer tail's serial change (PlanProblem device_tail_serial_ms): the device's
  // update of layer 0 before the forward in place of layer 0's CPU share; 0 without a tail.
  double device_tail_serial_ms = 0;
  double gpu_peak_gb = 0;
  int gpu_peak_window = 0;
  // Host memory of the plan: the model state (host_fixed_gb), the host-homed boundaries and the
  // NVMe bounce buffer (nvme_bounce_gb). The executor allocates all three for the whole run, so
  // this is the host memory of every window, not only of the busiest.
  double host_peak_gb = 0;
  // The NVMe bounce buffer in host_peak_gb: PlanProblem nvme_bounce_gb when some boundary's home
  // is NVMe, else 0.
  double nvme_bounce_gb = 0;
  double nvme_peak_gb = 0;
  double tflops = 0;                      // model_flops_per_step / step (anchors' convention)
  std::vector<double> window_compute_ms;  // [2L+1]
  std::vector<double> window_exposed_ms;  // [2L+1]
  std::vector<double> window_gpu_gb;      // [2L+1]
  // [2L+1] how long window t starts late waiting for its layer's update (forward windows only;
  // sums to optimizer_wait_ms).
  std::vector<double> window_optimizer_wait_ms;
  // Time per step the GPU waits on something other than its compute and the serial part: exposed
  // transfers, forward windows held by the optimizer, the optimizer outlasting the GPU, and the
  // host-home term (measured as exposed time: docs/plan.md).
  double idle_ms() const {
    return exposed_ms + optimizer_wait_ms + optimizer_bound_ms + host_home_ms;
  }
  bool operator==(const Prediction&) const = default;
};

struct SolverInfo {
  std::string solver;  // "cbc", "exact", "fixed"
  std::string status;  // "optimal" (proven within SolveOptions::rel_gap: `gap` says how close),
                       // "time_limit" (incumbent kept), "cbc_no_incumbent" (CBC stopped
                       // early without a plan; the best fixed policy kept), "within_gap" (CBC
                       // stopped at rel_gap and a fixed policy beat its plan: that one kept),
                       // "evaluated",
                       // "fixed_kept:<policy>" (ferry plan's executor check: that fixed policy,
                       // as the executor holds it, predicted faster than the MILP's plan)
  double objective_ms = 0;  // the solver's own objective value
  double bound_ms = 0;      // best lower bound (== objective when optimal)
  double gap = 0;           // (objective - bound) / objective
  double seconds = 0;
  bool operator==(const SolverInfo&) const = default;
};

struct Plan {
  std::string policy;  // "solved", "all-gpu", "all-host", "checkpoint-every-4", ...
  int num_layers = 0;
  int batch_size = 0;
  int seq_len = 0;
  std::vector<Home> homes;  // [L+1]
  std::vector<Span> spans;  // path from boundary 0 to L, in order
  // [L] or empty (= all false): layer j's forward keeps its internals on the GPU until its
  // backward, which skips the re-forward (PlanProblem keep_allowed). JSON: "keep_internals".
  std::vector<bool> keep_internals;
  // Decoder layers 0..K-1 GPU-resident (PlanProblem::resident_layers; ferry train
  // --resident-layers K). JSON: "resident_layers" (absent in older files: 0).
  int resident_layers = 0;
  // The device optimizer tail the plan was solved with (PlanProblem::device_update_layers, as the
  // layers it may update: min(K, L - resident_layers); ferry train --device-update-layers K): the
  // tail search's choice with --device-update-layers auto (device_tail.h), else the one given.
  // JSON: "device_update_layers" (absent in older files: the problem's, else 0).
  int device_update_layers = 0;
  std::vector<Transfer> transfers;
  Prediction predicted;
  SolverInfo solver;
  bool operator==(const Plan&) const = default;

  bool keeps(int layer) const {
    return layer >= 0 && layer < static_cast<int>(keep_internals.size()) && keep_internals[layer];
  }
  int num_kept() const {
    return static_cast<int>(std::count(keep_internals.begin(), keep_internals.end(), true));
  }
};

}  // namespace ferry::plan
