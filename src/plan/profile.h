// SPDX-License-Identifier: Apache-2.0
// Measured costs that override the analytic model: per-layer forward/backward/recompute times,
// the loss window, link rates alone / duplex / duplex under CPU-optimizer load, NVMe rates and the
// CPU optimizer's time per step, cached per machine and model geometry as JSON:
//
//   {"format": "ferry-plan-profile", "version": 1, "machine": "h200", "geometry": "<key>",
//    "batch_size": 8, "seq_len": 1024, "measured_by": "...",
//    "link": {"h2d_gbps": .., "d2h_gbps": .., "duplex_gbps": .., "duplex_loaded_gbps": ..,
//             "nvme_read_gbps": .., "nvme_write_gbps": ..},
//    "layers": [{"fwd_ms": .., "bwd_ms": .., "rec_ms": .., "reforward_ms": ..}, ...],
//    "loss_ms": .., "cpu_optimizer_ms": .., "optimizer_layer_ms": [..] (optional: each layer's
//    update), "host_home_ms_per_gb": .., "host_home_measured_by": ".." (optional: the host-home
//    term, PlanProblem::host_home_ms_per_gb; absent in profiles written before it: read as 0),
//    "device_update_ms_per_layer": .., "device_update_h2d_gb_per_layer": ..,
//    "device_update_measured_by": ".." (optional: the device optimizer tail as measured; absent
//    or 0: derived)}
//
// reforward_ms is the backward's internals-only re-forward (cost_model.h reforward_flop_share),
// the time keeping the layer's internals saves. A profile without it (written before the
// re-forward became internals-only) reads it as rec_ms x reforward_flop_share of the model it is
// read for; its bwd_ms were measured with a full re-forward inside, so they overstate today's
// backward of a dense layer by about (1 - share) x forward (~0.29 x at Qwen2.5-3B/7B, seq 1024):
// re-measure (`ferry plan --from-bench`) for current numbers.
//
// Times measured at (batch_size, seq_len) are scaled linearly in the batch for other batches
// (compute at fixed seq is linear in B); a different seq_len is refused (attention is quadratic).
// Written by `ferry plan --from-bench REPORT --write-profile auto|PATH` from a `ferry bench train`
// run's device policy (bench_profile.h); without one the analytic model is the default.
// Tests: tests/unit/plan/json_cost_test.cpp, bench_profile_test.cpp.
#pragma once

#include <string>
#include <vector>

#include "core/result.h"
#include "model/config.h"
#include "plan/problem.h"

namespace ferry::plan {

struct LayerTimes {
  double fwd_ms = 0;        // forward of the layer in the forward pass
  double bwd_ms = 0;        // backward, incl. the internals-only re-forward
  double rec_ms = 0;        // full forward when recomputing a span
  double reforward_ms = 0;  // the backward's internals-only re-forward (what a keep saves)
};

struct Profile {
  std::string machine;
  std::string geometry;  // geometry_key() of the model it was measured on
  int batch_size = 0;
  int seq_len = 0;
  std::string measured_by;
  LinkRates link;
  std::vector<LayerTimes> layers;
  double loss_ms = 0;
  double cpu_optimizer_ms = 0;
  // Each layer's CPU update, measured per unit (empty: not measured; the total is split by weight).
  // Not scaled with the batch: the update touches every parameter once whatever the batch.
  std::vector<double> optimizer_layer_ms;
  // The measured cost of boundaries homed off the GPU, ms per GB homed (PlanProblem
  // host_home_ms_per_gb; bench_profile.h derives it from a device and a host run at one batch).
  // Not scaled with the batch: boundary bytes scale with it, the cost per GB does not.
  double host_home_ms_per_gb = 0;
  // How it was measured; empty: not measured (an older profile, or a bench without a host run),
  // host_home_ms_per_gb is then 0.
  std::string host_home_measured_by;
  // The measured saving of each GPU-resident layer beyond the model, ms per layer per step
  // (PlanProblem::resident_saved_ms; bench_profile.h derives it from a device run at K = 0 and one
  // with resident layers at the same batch). Not scaled with the batch. Empty measured_by: not
  // measured, 0.
  double resident_saved_ms = 0;
  std::string resident_saved_measured_by;
  // The device optimizer tail as a bench run with it measured (bench_profile.h): the device's time
  // per layer it updated (PlanProblem::device_update_ms_per_layer) and its H2D bytes per layer
  // (device_update_h2d_gb_per_layer), both per unit and not scaled with the batch (the update
  // touches every parameter once whatever the batch). 0: not measured (the planner derives them);
  // ferry plan --device-update-ms-per-layer overrides the time.
  double device_update_ms_per_layer = 0;
  double device_update_h2d_gb_per_layer = 0;
  std::string device_update_measured_by;
};

// "2.15 ms/GB (device 2247.8 vs host 2374.4 ms ...)" or "0 (not measured: ...)": the term as the
// profile's users print it.
std::string host_home_text(const Profile& p);
// Likewise for the resident-saving term.
std::string resident_saved_text(const Profile& p);
// Likewise for the device tail's measured time and bytes per layer.
std::string device_update_text(const Profile& p);

// "qwen2-L36-C2048-F11008-H16-KV2-D128-V151936-E0": what fixes per-layer cost.
std::string geometry_key(const model::ModelConfig& c);
// $FERRY_CACHE_DIR, else $XDG_CACHE_HOME/ferry, else $HOME/.cache/ferry; then
// plan/<machine>__<geometry>.json.
std::string default_profile_path(const std::string& machine, const std::string& geometry);

Json to_json(const Profile& p);
// cfg: the model the profile is read for; gives a layer without "reforward_ms" (an old profile)
// rec_ms x reforward_flop_share(cfg, layer, the profile's seq_len).
Result<Profile> profile_from_json(const Json& j, const model::ModelConfig& cfg);
// read_profile also refuses a profile of other shapes than cfg's (its geometry key past the
// architecture: layers, widths, heads, vocabulary, experts): its times are another model's. An
// architecture-only difference (qwen2 vs qwen3 of the same shapes: profiles written by --from-bench
// before it read the report's arch were keyed qwen3) is logged as a warning and read.
Result<Profile> read_profile(const std::string& path, const model::ModelConfig& cfg);
Status write_profile(const std::string& path, const Profile& p);

// Overrides p's times and rates; refuses a profile of another layer count or sequence length.
Status apply_profile(const Profile& prof, PlanProblem& p);

}  // namespace ferry::plan
