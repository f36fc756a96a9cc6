// SPDX-License-Identifier: Apache-2.0
// The machine half of the planner's costs, measured instead of assumed: a short run of the
// runtime's own pieces on this machine (`ferry plan --measure-machine`) fills the rates of
// MachineSpec (cost_model.h) that the analytic model turns into per-layer times:
//   - host->GPU and GPU->host copy rates of pinned memory, alone, both at once, and both at once
//     while the CPU optimizer streams host memory (the LazyTrain window the planner models);
//   - NVMe write/read rates of the spill store (mem::NvmeStore, O_DIRECT/io_uring when available)
//     in the folder given, moved the way the training executor moves boundaries through its one
//     bounce buffer: one boundary-sized record at a time (submit, wait, next), all records written,
//     then read back in the same order;
//   - bf16 GEMM TFLOP/s at the model's layer shapes (q/k/v, o, gate+up, down) and flash-attention
//     forward/backward TFLOP/s at the training sequence length, through the CUDA backend;
//   - the elementwise (HBM) rate of the backend's add;
//   - the CPU optimizer's rate (fused fp32 AdamW on all cores, parameters/s).
// What cannot be measured here (no CUDA device, no --nvme-dir) stays at MachineSpec's default and
// is listed under "not_measured", so a plan always says which of its numbers are assumptions.
// Per-layer times of a real layer (fwd/bwd/recompute as one unit) come from the streaming
// executor's profile (profile.h), not from here.
//
// JSON: {"format": "ferry-machine-profile", "version": 1, "machine": .., "measured_by": ..,
//        "gpu": .., "cpu_threads": .., "rates": {<MachineSpec field>: value, ...},
//        "measured": [field, ...], "not_measured": [{"field": .., "why": ..}, ...]}
// Cached at <cache>/plan/machine__<machine>.json (default_machine_profile_path); `ferry plan`
// applies the cached file for --machine automatically. Tests:
// tests/unit/plan/machine_profile_test.cpp.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "model/config.h"
#include "plan/cost_model.h"

namespace ferry::plan {

struct MachineProfileOptions {
  std::string machine = "h200";
  std::string nvme_dir;                 // empty: NVMe not measured
  std::size_t link_bytes = 256u << 20;  // per copy
  // NVMe: records of nvme_record_bytes, nvme_bytes / nvme_record_bytes of them, each written then
  // (after all are written) read back one at a time. The executor's record is one f32 boundary,
  // B x S x hidden x 4 bytes (stream_executor.cpp, its NvmeStore); the profile does not know the
  // run's batch, so the default is 256 MiB: exactly the boundary of the measured 3B runs (batch
  // 32 x 1024 x hidden 2048; 7B at 16 x 1024 is 224 MiB), the size class the plan's GPU runs
  // move (the kernel splits one such request into many device commands in flight, so a record
  // of nearby size is expected to give a similar rate; not measured). Pass the run's own
  // boundary (--nvme-record-mib) to measure exactly its size. 1 GiB in all: 4 records read back
  // in the order written, so the first read comes 768 MiB of writes after its record's write and
  // no read directly follows its record's write (which the drive's cache could serve). Any record
  // size > 0 works (the store moves it rounded up to 4 KiB, as the executor's record);
  // nvme_record_bytes <= nvme_bytes.
  std::size_t nvme_record_bytes = 256u << 20;
  std::size_t nvme_bytes = std::size_t{1} << 30;
  std::size_t optimizer_params = 32u << 20;
  std::int64_t gemm_tokens = 4096;       // M of the layer GEMMs
  std::int64_t attention_tokens = 8192;  // packed tokens of the attention measurement
  int seq_len = 1024;
  int reps = 5;  // median of reps for each rate
};

struct NotMeasured {
  std::string field;
  std::string why;
};

struct MachineProfile {
  std::string machine;
  std::string measured_by;
  std::string gpu;  // device name, or "none"
  int cpu_threads = 0;
  MachineSpec spec;                   // measured fields overwrite the defaults
  std::vector<std::string> measured;  // MachineSpec field names
  std::vector<NotMeasured> not_measured;
};

// Runs the measurements for the geometry's layer shapes (cfg) on this machine.
Result<MachineProfile> measure_machine(const model::ModelConfig& cfg,
                                       const MachineProfileOptions& opts);

// Copies the measured fields of `prof` into `spec` (unmeasured ones keep spec's values).
void apply_machine_profile(const MachineProfile& prof, MachineSpec& spec);

Json to_json(const MachineProfile& p);
Result<MachineProfile> machine_profile_from_json(const Json& j);
Result<MachineProfile> read_machine_profile(const std::string& path);
Status write_machine_profile(const std::string& path, const MachineProfile& p);
// <cache>/plan/machine__<machine>.json (the cache folder of default_profile_path).
std::string default_machine_profile_path(const std::string& machine);

}  // namespace ferry::plan
