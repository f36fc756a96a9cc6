// SPDX-License-Identifier: Apache-2.0
// Predicted vs measured (issue #7) from a `ferry bench train` report (src/train/train_bench.h,
// measured on the GPU): the report's all-on-GPU run becomes a measured plan Profile (profile.h) —
// per layer, forward = the forward window's GPU time minus its exposed time, backward likewise
// (it includes the internals-only re-run of the layer's forward), recompute = forward, re-forward
// (what a keep saves) = forward x reforward_flop_share (cost_model.h); the loss window; the
// CPU optimizer's busy time per step — and every other benched policy the planner knows
// (every:K = checkpoint-every-K, host = all-host, device = all-gpu) is priced under that profile
// and set next to its measured step time.
//
// What is measured and what is modelled: layer compute times come from the device run; link
// rates from the machine description (MachineSpec, or a measured machine profile); the serial
// part outside the windows (embedding, flushes, the step's end) is the device run's step time
// minus its windows, assumed the same for every policy. Transfers (boundaries out and back,
// re-streamed weights of recompute), their overlap with compute and the forward windows held
// back by the CPU optimizer (Prediction::optimizer_wait_ms) are the model's — so the device run
// itself checks the optimizer model and the other policies check transfers and recompute.
// The stream executor streams f32 weights and keeps f32 boundaries today: the problem is built
// with 4 bytes per weight, gradient and activation element.
// With a `host` run at the device run's batch beside it, the profile also gets the measured cost
// of off-GPU boundary homes (Profile::host_home_ms_per_gb: the host run's step beyond the device
// run's, less the model's own difference, per GB homed = act_bytes_per_step / 2; clamped at 0);
// without one it is 0 and the text says so. The host policy's check then includes the term fitted
// to it (not an independent check).
// The device optimizer tail, when some policy of the report ran one (a plan=FILE policy solved
// with a tail; the device run itself must not: its CPU optimizer times would be the CPU's share
// only), gives the profile's device_update_ms_per_layer (the tail's busy time over its units: its
// pace) and device_update_h2d_gb_per_layer (its H2D bytes per unit).
// NVMe rates: where a run homed boundaries on NVMe, the profile's link gets the disk rates that
// run's executor measured in its own disk calls (nvme_write_gbps / nvme_read_gbps of the report),
// not the machine's; measured_by says which run.
// Tests: tests/unit/plan/bench_profile_test.cpp.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "model/config.h"
#include "plan/cost_model.h"
#include "plan/profile.h"

namespace ferry::plan {

struct BenchCheck {
  std::string policy;       // the executor's name ("every:4")
  std::string plan_policy;  // the planner's ("checkpoint-every-4")
  double measured_ms = 0, predicted_ms = 0;
  // predicted: Prediction::idle_ms() (exposed link time + optimizer wait + optimizer bound)
  double measured_exposed_ms = 0, predicted_exposed_ms = 0;
  double error() const { return predicted_ms / measured_ms - 1.0; }
};

struct BenchPrediction {
  Profile profile;
  double serial_ms = 0;  // the device run's step time outside the windows
  std::vector<BenchCheck> checks;
};

// A `ferry bench train --json` report read from `path` (`flag` names the option in errors):
// not_found, corrupt (not JSON, or no "policies" array) or invalid_argument (another kind of
// report).
Result<Json> read_bench_report(const std::string& path, const char* flag);

// The disk as a benched run's executor used it (train_bench.cpp nvme_*_gbps: bytes per step over
// the seconds its host spent in the disk calls): of the report's runs that homed boundaries on
// NVMe, the one that wrote the most bytes per step; nullopt when none did.
struct ExecutorDiskRates {
  std::string policy;
  double write_gbps = 0, read_gbps = 0;
  double write_bytes_per_step = 0;
};
std::optional<ExecutorDiskRates> executor_disk_rates(const Json& report);

// The planner's name of an executor policy, or "" when it has none.
std::string plan_policy_name(const std::string& executor_policy);

// cfg: the benched model's config (its layer count and seq must match the report).
// resident_report (optional): a second report of the same model and batch whose `device` run kept
// resident layers (`--resident-layers K|auto`): the resident-saving term (Profile
// resident_saved_ms) is what it measured beyond the model's difference, per layer made resident.
Result<BenchPrediction> predict_bench(const Json& report, const model::ModelConfig& cfg,
                                      const MachineSpec& machine,
                                      const Json* resident_report = nullptr);
Json to_json(const BenchPrediction& b);
std::string bench_prediction_text(const BenchPrediction& b);

}  // namespace ferry::plan
