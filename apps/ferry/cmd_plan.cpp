// SPDX-License-Identifier: Apache-2.0
// `ferry plan (--model DIR | --geometry NAME) (--batch-size B | --batch-size auto) --seq-len S
//   --gpu-mem-gb G --host-mem-gb H [--nvme-dir D --nvme-gb N] [--json OUT] [--time-limit-s T]`:
// solves the activation schedule (src/plan, docs/plan.md) and prints it (per boundary: home or
// recompute; per layer: whether its internals are kept; per window: predicted exposure), the
// predicted step and peak memory per tier, and the fixed policies next to it; --json writes the
// plan (--no-keep-internals: no layer keeps its internals). `--compare --gpu-caps 24,40,80` prints,
// as JSON, the solved plan against the fixed policies at each GPU cap. Every figure is a prediction
// of the cost model (analytic, or a measured profile when one is cached), never a measurement.
// `ferry plan --measure-machine [--geometry NAME | --model DIR] [--nvme-dir D]
//   [--nvme-record-mib R] [--nvme-measure-mib T] [--machine NAME] [--machine-profile OUT]`
// measures this machine's rates (plan/machine_profile.h; NVMe in records of R MiB one at a time,
// as the executor moves boundaries) and caches them; later plans for that --machine use them
// instead of the assumed defaults.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "apps/ferry/cmd_plan_evaluate.h"
#include "apps/ferry/cmd_plan_executor_fit.h"
#include "apps/ferry/commands.h"
#include "apps/ferry/device_update_flags.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/log.h"
#include "mem/device_info.h"
#include "model/config.h"
#include "plan/bench_profile.h"
#include "plan/compare.h"
#include "plan/cost_model.h"
#include "plan/device_tail.h"
#include "plan/geometry.h"
#include "plan/machine_profile.h"
#include "plan/plan_json.h"
#include "plan/policies.h"
#include "plan/profile.h"
#include "plan/report.h"
#include "plan/resident.h"
#include "plan/search.h"
#include "train/builtin_model.h"
#include "train/optim/optim_modes.h"
#include "train/stream/device_plan.h"

namespace ferry::app {
namespace {

struct PlanConfig {
  std::string model_dir;
  std::string geometry;
  std::string batch = "auto";
  int seq_len = 1024;
  double gpu_mem_gb = 0;
  double host_mem_gb = 0;
  std::string nvme_dir;
  double nvme_gb = 0;
  std::string json_out;
  double time_limit_s = 30;
  // CBC's relative gap (SolveOptions::rel_gap) for ferry plan's solves. 1e-3 is 2 ms of a 2 s
  // step, far below the profile's noise (1-5 % between calls) and the model's error (up to ~10 %);
  // the library's 1e-7 ran every 3B solve to its time limit once homes had a price (H200, session
  // 17: 10 s per solve, gap 2e-5, ~17 solves per batch probe, 9.5 min for `--batch-size auto`),
  // and 1e-4 still left 7B near its memory limit at its limit (a 1 ms gap of 3 s unclosed in 30 s).
  double mip_gap = 1e-3;
  int max_span = 4;
  int max_batch = 512;
  double host_state_bytes_per_param = 16;
  std::string master;            // with optimizer_states: host bytes/param from the optimizer mode
  std::string optimizer_states;  // (train/optim/optim_modes.h) instead of a number
  std::string grad_dtype = "f32";       // ferry train --grad-dtype: host gradient bytes, GPU twins
  bool host_state_bytes_given = false;  // --host-state-bytes-per-param was on the command line
  std::string profile;  // explicit profile; else the cached one for machine + geometry, if any
  std::string machine = "h200";
  double link_gbps = 0;  // > 0: override the link (h2d = d2h = X, duplex 1.8X, loaded 1.5X)
  bool compare = false;
  std::string gpu_caps = "24,40,80";
  bool no_policies = false;
  bool measure_machine = false;
  std::string from_bench;           // `ferry bench train` JSON: predicted vs measured per policy
  std::string from_bench_resident;  // a second one whose device run kept resident layers
  std::string write_profile;        // with --from-bench: write the measured profile (PATH or auto)
  std::string machine_profile;      // explicit machine profile (in or, with --measure-machine, out)
  // --evaluate PLAN: the plan priced again (cmd_plan_evaluate.h) at these rates (> 0: given), the
  // --from-bench report's disk rates and --link-gbps.
  std::string evaluate;
  double eval_nvme_read_gbps = 0;
  double eval_nvme_write_gbps = 0;
  // --measure-machine's NVMe records (MachineProfileOptions::nvme_record_bytes / nvme_bytes).
  std::size_t nvme_record_mib = 256;
  std::size_t nvme_measure_mib = 1024;
  // GPU memory as the stream executor will allocate it (cmd_plan_executor_fit.h) for this device's
  // backend: auto (cuda when present), cpu, cuda, or none (the cost model's bf16 estimate).
  std::string executor_device = "auto";
  // The executor's device optimizer tail (ferry train --device-update-layers): 0 off, K,
  // train::stream::kDeviceUpdateAllLayers (all) or kDeviceUpdateAuto (the solve picks K:
  // plan/device_tail.h); its ms per layer (0: derived, problem.h); its staging slots
  // (--device-update-slots: device bytes, counted by the executor fit).
  int device_update_layers = 0;
  double device_update_ms_per_layer = 0;
  int device_update_slots = 2;
  bool no_keep_internals = false;  // PlanProblem::allow_keep_internals = false
  // GPU-resident layers (ferry train --resident-layers): K forced, or plan::kResidentAuto (the
  // solve picks K); the GPU update's ms per resident layer (0: assumed, problem.h).
  int resident_layers = plan::kResidentAuto;
  double resident_update_ms_per_layer = 0;
};

PlanConfig& plan_config() {
  static PlanConfig c;
  return c;
}

Result<model::ModelConfig> load_geometry(const PlanConfig& c) {
  if (!c.model_dir.empty() && !c.geometry.empty()) {
    return invalid_argument("plan: give --model or --geometry, not both");
  }
  if (!c.model_dir.empty()) return model::load_model_config(c.model_dir);
  if (!c.geometry.empty()) return plan::builtin_geometry(c.geometry);
  return invalid_argument("plan: need --model DIR or --geometry NAME");
}

// The machine's rates: --machine-profile, else the cached profile of --machine, else assumed.
Result<plan::MachineSpec> machine_spec(const PlanConfig& c) {
  plan::MachineSpec machine;
  machine.name = c.machine;
  std::string mpath = c.machine_profile;
  if (mpath.empty()) {
    const std::string cached = plan::default_machine_profile_path(c.machine);
    if (std::filesystem::exists(cached)) mpath = cached;
  }
  if (!mpath.empty()) {
    FERRY_ASSIGN_OR_RETURN(plan::MachineProfile mp, plan::read_machine_profile(mpath));
    plan::apply_machine_profile(mp, machine);
    std::string assumed;
    for (const plan::NotMeasured& n : mp.not_measured)
      assumed += (assumed.empty() ? "" : ",") + n.field;
    log::get("plan")->info("machine profile={} measured={} assumed={}", mpath, mp.measured.size(),
                           assumed.empty() ? "none" : assumed);
  } else {
    log::get("plan")->info(
        "no machine profile for machine={}: assumed rates (run ferry plan --measure-machine)",
        c.machine);
  }
  return machine;
}

// Whether the executor can keep layers GPU-resident in c's optimizer mode: not with an fp32 master
// and fp32 states (no device kernel: ResidentLayers::check; train's defaults); nor a device tail
// (DeviceOptimizerTail::check): `--device-update-layers auto` means 0 there.
bool resident_possible(const PlanConfig& c) {
  const bool f32_master = c.master.empty() || c.master == "fp32";
  const bool f32_states = c.optimizer_states.empty() || c.optimizer_states == "fp32";
  return !(f32_master && f32_states);
}

// --device-update-layers auto where the device has a kernel for the mode: the solve picks K.
bool tail_search(const PlanConfig& c) {
  return c.device_update_layers == kDeviceUpdateAuto && resident_possible(c);
}

// GPU memory as the stream executor allocates it (--executor-device; none: the cost model's).
Result<std::optional<ExecutorTarget>> executor_of(const PlanConfig& c) {
  if (c.executor_device == "none") return std::optional<ExecutorTarget>();
  FERRY_ASSIGN_OR_RETURN(ExecutorTarget exec,
                         executor_target(c.executor_device, c.master, c.grad_dtype == "bf16"));
  if (!c.optimizer_states.empty()) {
    FERRY_ASSIGN_OR_RETURN(exec.mode.states, train::parse_optimizer_states(c.optimizer_states));
  }
  // auto: the fit sizes the staging for a tail over every layer (plan/device_tail.h picks K);
  // each solve then counts it for the problem's own K (for_executor).
  exec.device_update_layers = c.device_update_layers != kDeviceUpdateAuto ? c.device_update_layers
                              : tail_search(c) ? train::stream::kDeviceUpdateAllLayers
                                               : 0;
  exec.device_update_slots = c.device_update_slots;
  if (exec.device_update_layers != 0 && exec.mode.master == train::MasterWeights::kF32 &&
      exec.mode.states == train::OptimizerStates::kF32) {
    // ferry train refuses the same (DeviceOptimizerTail::check); the staging's size needs the mode.
    return invalid_argument(
        "plan: --device-update-layers: the device optimizer tail has no kernel for fp32 master + "
        "fp32 states (ferry train's defaults, refused there too); give --master bf16-kahan|bf16-sr "
        "or --optimizer-states 8bit as the run will, or --executor-device none");
  }
  log::get("plan")->info(
      "gpu memory as the stream executor allocates it on {} ({} GEMMs, {} weights; "
      "--executor-device none: the cost model's estimate)",
      exec.backend->device() == Device::kCpu ? "the cpu" : "cuda", model::to_string(exec.precision),
      exec.bf16_weights ? "bf16" : "f32");
  return std::optional<ExecutorTarget>(exec);
}

// exec with the tail of problem p (its layers above the resident ones: device_tail_layers), so
// that the executor's bytes count the staging of the K the problem was solved at (0: none).
ExecutorTarget with_tail_of(ExecutorTarget exec, const plan::PlanProblem& p) {
  exec.device_update_layers = plan::device_tail_layers(p);
  return exec;
}

// What the executor will allocate for the solved plan, the device tail's staging included.
Status log_executor_bytes(const plan::PlanProblem& p, const plan::Plan& solved,
                          const model::ModelConfig& cfg,
                          const std::optional<ExecutorTarget>& exec) {
  if (!exec) return ok_status();
  const ExecutorTarget t = with_tail_of(*exec, p);
  FERRY_ASSIGN_OR_RETURN(const double gb, executor_gpu_gb(p, solved, cfg, t));
  log::get("plan")->info(
      "executor gpu bytes {} for the plan at batch {} (device optimizer tail staging {} bytes: "
      "--device-update-layers {} x {} slots)",
      std::llround(gb * 1e9), p.batch_size,
      device_tail_staging_bytes(cfg, t, plan::resident_count(p)),
      exec->device_update_layers == train::stream::kDeviceUpdateAllLayers
          ? std::string("all")
          : std::to_string(t.device_update_layers),
      exec->device_update_slots);
  return ok_status();
}

// The plan document with the model it was solved for ("model": train::stream::device_plan_model),
// which ferry bench train checks a plan=FILE against: another architecture or shape has other
// GPU bytes (a Qwen3 q/k norm's workspaces), so the plan's fit and step do not hold there.
Status write_plan_document(const std::string& path, const plan::Plan& solved,
                           const plan::PlanProblem& p, const model::ModelConfig& cfg) {
  Json j = plan::plan_to_json(solved, &p);
  j["model"] = train::stream::device_plan_model(cfg);
  return write_file_atomic(path, j.dump(1) + "\n");
}

// `solve`, and with an executor target its solution checked against the executor's bytes; all
// inside the search over GPU-resident layers (plan/resident.h; c.resident_layers: K or
// plan::kResidentAuto), so every plan, probe and comparison has its best K.
plan::Planner for_executor(plan::Planner solve, const std::optional<ExecutorTarget>& exec,
                           const model::ModelConfig& cfg, const PlanConfig& c) {
  // Without a device kernel for the mode, auto means none (a forced K is refused up front).
  const int resident = resident_possible(c) ? c.resident_layers : 0;
  // A numeric device tail of n layers needs n layers above the resident ones (auto: any).
  const int reserve = std::max(0, c.device_update_layers);
  plan::Planner inner = std::move(solve);
  if (exec) {
    inner = [solve = std::move(inner), exec = *exec, cfg](const plan::PlanProblem& p) {
      return solve_for_executor(p, solve, cfg, with_tail_of(exec, p));
    };
  }
  // --device-update-layers auto: each resident K with its best tail on the layers above.
  if (tail_search(c)) inner = plan::device_tail_planner(std::move(inner));
  return plan::resident_planner(std::move(inner), resident, reserve);
}

// CBC's options for the plan's own solve and for the batch-search probes (at most 10 s each).
plan::SolveOptions solve_options(const PlanConfig& c) {
  return {.time_limit_s = c.time_limit_s, .rel_gap = c.mip_gap};
}
plan::SolveOptions probe_options(const PlanConfig& c) {
  return {.time_limit_s = std::min(c.time_limit_s, 10.0), .rel_gap = c.mip_gap};
}

PlanConfig with_resident(const PlanConfig& c, int k) {
  PlanConfig z = c;
  z.resident_layers = k;
  return z;
}

// c with the device tail searched turned into K = 0 (the search's least memory, so the largest
// batch any K fits is the largest K = 0 fits).
PlanConfig without_tail_search(const PlanConfig& c) {
  PlanConfig z = c;
  if (z.device_update_layers == kDeviceUpdateAuto) z.device_update_layers = 0;
  return z;
}

// The comparison's batch-search probes: K = 0 resident layers (resident bytes only add memory, so
// the largest batch any K fits is the largest K = 0 fits; compare_policies re-solves the plan
// there with the full search). Saves the search over K in every probe.
plan::Planner compare_probe(const PlanConfig& c, const plan::SolveOptions& probe,
                            const std::optional<ExecutorTarget>& exec,
                            const model::ModelConfig& cfg);

// The batch search's options: with K = auto, its fitting probes at K = 0 (the same argument as
// compare_probe's) and only the largest fitting batch and the exposure walk-down searched over K
// (3B at 40 GiB: 6 probes x ~14 solves took 2-6 minutes before).
plan::BatchSearchOptions batch_search_options(const PlanConfig& c, const plan::SolveOptions& probe,
                                              const std::optional<ExecutorTarget>& exec,
                                              const model::ModelConfig& cfg) {
  plan::BatchSearchOptions o{.max_batch = c.max_batch};
  if (c.resident_layers == plan::kResidentAuto || tail_search(c)) {
    o.fit_planner = compare_probe(c, probe, exec, cfg);
  }
  return o;
}

// Problem factory for one GPU cap: analytic costs, overridden by a profile when one applies, GPU
// memory fitted to the executor when `exec` is given.
Result<plan::ProblemAt> make_problem_at(const PlanConfig& c, const model::ModelConfig& cfg,
                                        double gpu_gb, const std::optional<ExecutorTarget>& exec) {
  std::optional<plan::Profile> prof;
  std::string path = c.profile;
  if (path.empty()) {
    const std::string cached = plan::default_profile_path(c.machine, plan::geometry_key(cfg));
    if (std::filesystem::exists(cached)) path = cached;
  }
  if (!path.empty()) {
    FERRY_ASSIGN_OR_RETURN(plan::Profile p, plan::read_profile(path, cfg));
    log::get("plan")->info(
        "profile={} measured_by=\"{}\" host_homes=\"{}\" resident_saving=\"{}\" "
        "device_tail=\"{}\"",
        path, p.measured_by, plan::host_home_text(p), plan::resident_saved_text(p),
        plan::device_update_text(p));
    prof = std::move(p);
  } else {
    log::get("plan")->info(
        "no measured profile for machine={} geometry={}: analytic cost model (ferry plan "
        "--from-bench R --write-profile auto turns a ferry bench train run into one)",
        c.machine, plan::geometry_key(cfg));
  }
  FERRY_ASSIGN_OR_RETURN(plan::MachineSpec machine, machine_spec(c));
  if (c.link_gbps > 0) {
    plan::set_symmetric_link(machine.link, c.link_gbps);
    machine.name += fmt::format("-link{:g}", c.link_gbps);
  }
  const plan::Capacities caps{
      .gpu_gb = gpu_gb, .host_gb = c.host_mem_gb, .nvme_gb = c.nvme_dir.empty() ? 0.0 : c.nvme_gb};
  return plan::ProblemAt([=](int batch) -> Result<plan::PlanProblem> {
    plan::TrainShape shape{.batch_size = batch,
                           .seq_len = c.seq_len,
                           .host_state_bytes_per_param = c.host_state_bytes_per_param,
                           .max_span = c.max_span};
    FERRY_ASSIGN_OR_RETURN(plan::PlanProblem p, plan::analytic_problem(cfg, machine, shape, caps));
    if (prof) FERRY_TRY(plan::apply_profile(*prof, p));
    if (exec) FERRY_TRY(fit_gpu_memory_to_executor(p, cfg, *exec));
    // auto: K = 0 here; the tail search (for_executor) sets each solve's K.
    p.device_update_layers = c.device_update_layers == kDeviceUpdateAuto ? 0
                             : c.device_update_layers < 0
                                 ? p.num_layers
                                 : std::min(c.device_update_layers, p.num_layers);
    // Given: it overrides a profile's measured time (0: the profile's, else derived).
    if (c.device_update_ms_per_layer > 0)
      p.device_update_ms_per_layer = c.device_update_ms_per_layer;
    p.allow_keep_internals = !c.no_keep_internals;
    p.resident_update_ms_per_layer = c.resident_update_ms_per_layer;
    return p;
  });
}

Result<int> parse_batch(const std::string& s) {
  if (s == "auto") return 0;
  try {
    std::size_t used = 0;
    const int b = std::stoi(s, &used);
    if (used == s.size() && b >= 1) return b;
  } catch (const std::exception&) {
  }
  return invalid_argument("plan: --batch-size must be a positive integer or auto, got \"{}\"", s);
}

Status run_compare(const PlanConfig& c, const model::ModelConfig& cfg, int batch) {
  FERRY_ASSIGN_OR_RETURN(const std::optional<ExecutorTarget> exec, executor_of(c));
  std::vector<double> caps;
  std::stringstream ss(c.gpu_caps);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      caps.push_back(std::stod(item));
    } catch (const std::exception&) {
      return invalid_argument("plan: --gpu-caps: bad number \"{}\"", item);
    }
  }
  Json out = {{"what",
               "predicted by ferry's plan cost model, not measured (scripts/gpu_plan_caps.sh "
               "measures the plan and the fixed policies at GPU caps)"},
              {"geometry", plan::geometry_key(cfg)},
              {"seq_len", c.seq_len},
              {"host_mem_gb", c.host_mem_gb},
              {"host_state_bytes_per_param", c.host_state_bytes_per_param},
              {"machine", c.machine},
              {"caps", Json::array()}};
  for (double gpu : caps) {
    FERRY_ASSIGN_OR_RETURN(plan::ProblemAt at, make_problem_at(c, cfg, gpu, exec));
    const plan::SolveOptions solve = solve_options(c);
    const plan::SolveOptions probe = probe_options(c);
    const plan::Planner solve_full = for_executor(
        [&](const plan::PlanProblem& p) { return plan::solve_milp(p, solve); }, exec, cfg, c);
    const plan::Planner solve_probe = for_executor(
        [&](const plan::PlanProblem& p) { return plan::solve_milp(p, probe); }, exec, cfg, c);
    int b = batch;
    std::optional<plan::Plan> solved;
    if (b == 0) {  // auto: the solved plan's own batch
      auto r = plan::largest_batch(at, solve_probe, batch_search_options(c, probe, exec, cfg));
      if (!r.ok()) return r.status();
      b = r->batch;
      FERRY_ASSIGN_OR_RETURN(plan::PlanProblem p, at(b));
      FERRY_ASSIGN_OR_RETURN(plan::Plan full, solve_full(p));
      solved = std::move(full);
    }
    plan::CompareOptions o{.solve = solve,
                           .probe_solve = probe,
                           .max_batch = c.max_batch,
                           .planner = solve_full,
                           .probe_planner = compare_probe(c, probe, exec, cfg)};
    if (solved) o.solved_at_batch = &*solved;
    FERRY_ASSIGN_OR_RETURN(plan::Comparison cmp, plan::compare_policies(at, b, o));
    Json j = plan::to_json(cmp);
    j["gpu_cap_gb"] = gpu;
    out["caps"].push_back(j);
    log::get("plan")->info("compare gpu_cap_gb={} batch={} done", gpu, b);
  }
  std::printf("%s\n", out.dump(2).c_str());
  if (!c.json_out.empty()) FERRY_TRY(write_file_atomic(c.json_out, out.dump(2) + "\n"));
  return ok_status();
}

Status run_measure_machine(const PlanConfig& c) {
  PlanConfig g = c;
  if (g.model_dir.empty() && g.geometry.empty()) g.geometry = "qwen2.5-3b";
  FERRY_ASSIGN_OR_RETURN(model::ModelConfig cfg, load_geometry(g));
  plan::MachineProfileOptions o;
  o.machine = c.machine;
  o.nvme_dir = c.nvme_dir;
  o.seq_len = c.seq_len;
  o.nvme_record_bytes = c.nvme_record_mib << 20;
  o.nvme_bytes = c.nvme_measure_mib << 20;
  FERRY_ASSIGN_OR_RETURN(plan::MachineProfile p, plan::measure_machine(cfg, o));
  const std::string path =
      c.machine_profile.empty() ? plan::default_machine_profile_path(c.machine) : c.machine_profile;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  FERRY_TRY(plan::write_machine_profile(path, p));
  const plan::MachineSpec assumed;
  const Json measured = plan::to_json(p);
  std::printf("machine %s (gpu %s, %d cpu threads): %s\n", p.machine.c_str(), p.gpu.c_str(),
              p.cpu_threads, p.measured_by.c_str());
  std::printf("%-28s %12s %12s\n", "rate", "measured", "assumed");
  const Json assumed_rates = plan::to_json(plan::MachineProfile{.spec = assumed})["rates"];
  for (const std::string& f : p.measured) {
    std::printf("%-28s %12.2f %12.2f\n", f.c_str(), measured["rates"][f].get<double>(),
                assumed_rates[f].get<double>());
  }
  for (const plan::NotMeasured& n : p.not_measured) {
    std::printf("%-28s %12s %12.2f  (%s)\n", n.field.c_str(), "-",
                assumed_rates[n.field].get<double>(), n.why.c_str());
  }
  std::printf("written to %s\n", path.c_str());
  return ok_status();
}

// --master / --optimizer-states (/ --grad-dtype) -> host state bytes per parameter of the
// streaming arena, the number `ferry train` prints for the same flags.
Status resolve_host_state(PlanConfig& c) {
  if (c.master.empty() && c.optimizer_states.empty()) return ok_status();
  if (c.host_state_bytes_given) {
    return invalid_argument(
        "plan: give --host-state-bytes-per-param or --master/--optimizer-states, not both");
  }
  train::OptimMode mode;
  if (!c.master.empty()) {
    FERRY_ASSIGN_OR_RETURN(mode.master, train::parse_master_weights(c.master));
  }
  if (!c.optimizer_states.empty()) {
    FERRY_ASSIGN_OR_RETURN(mode.states, train::parse_optimizer_states(c.optimizer_states));
  }
  const train::HostBytesPerParam b =
      train::host_bytes_per_param(mode, c.grad_dtype == "bf16" ? DType::kBF16 : DType::kF32);
  c.host_state_bytes_per_param = b.total();
  log::get("plan")->info(
      "host state {:.3f} bytes/param ({}: weights {:g} + master {:g} + states {:.3f} + grads {:g})",
      b.total(), train::describe(mode), b.weights, b.master, b.states, b.grads);
  return ok_status();
}

// --from-bench: the bench's all-on-GPU run as a measured profile; every benched policy priced
// under it next to its measured step time (plan/bench_profile.h).
Status run_from_bench(const PlanConfig& c) {
  FERRY_ASSIGN_OR_RETURN(const Json report, plan::read_bench_report(c.from_bench, "--from-bench"));
  // The benched model: the built-in layout of the report's architecture (`arch`: qwen3, the bench's
  // default, or qwen2; reports before it was recorded: qwen3) at its geometry (train_bench.h).
  const Json& g = report.at("geometry");
  const train::BuiltinModelSpec spec{.layers = g.at("layers").get<int>(),
                                     .hidden = g.at("hidden").get<int>(),
                                     .heads = g.at("heads").get<int>(),
                                     .kv_heads = g.at("kv_heads").get<int>(),
                                     .head_dim = g.at("head_dim").get<int>(),
                                     .intermediate = g.at("intermediate").get<int>(),
                                     .max_positions = report.at("seq").get<int>(),
                                     .vocab = g.value("vocab", train::kBuiltinVocab),
                                     .tie_embeddings = g.value("tie_embeddings", true),
                                     .model_type = report.value("arch", std::string("qwen3"))};
  if (!train::known_builtin_model_type(spec.model_type)) {
    return invalid_argument("plan: --from-bench {}: unknown arch {}", c.from_bench,
                            spec.model_type);
  }
  FERRY_ASSIGN_OR_RETURN(
      model::ModelConfig cfg,
      model::parse_model_config_text(train::builtin_config_json(spec), "bench train geometry"));
  FERRY_ASSIGN_OR_RETURN(const plan::MachineSpec machine, machine_spec(c));  // link rates
  Json resident;  // --from-bench-resident: the resident-saving term's run
  if (!c.from_bench_resident.empty()) {
    FERRY_ASSIGN_OR_RETURN(resident,
                           plan::read_bench_report(c.from_bench_resident, "--from-bench-resident"));
  }
  FERRY_ASSIGN_OR_RETURN(
      const plan::BenchPrediction b,
      plan::predict_bench(report, cfg, machine, resident.is_null() ? nullptr : &resident));
  std::printf("%s", plan::bench_prediction_text(b).c_str());
  std::fflush(stdout);
  if (!c.write_profile.empty()) {
    const std::string path = c.write_profile == "auto"
                                 ? plan::default_profile_path(c.machine, b.profile.geometry)
                                 : c.write_profile;
    FERRY_TRY(plan::write_profile(path, b.profile));
    log::get("plan")->info("profile written to {}", path);
  }
  if (!c.json_out.empty()) {
    std::ofstream out(c.json_out);
    out << plan::to_json(b).dump(2) << "\n";
    if (!out) return io_error("plan: cannot write {}", c.json_out);
  }
  return ok_status();
}

plan::Planner compare_probe(const PlanConfig& c, const plan::SolveOptions& probe,
                            const std::optional<ExecutorTarget>& exec,
                            const model::ModelConfig& cfg) {
  return for_executor([probe](const plan::PlanProblem& p) { return plan::solve_milp(p, probe); },
                      exec, cfg, without_tail_search(with_resident(c, 0)));
}

// The solved plan's GPU-resident layers against the same solve at K = 0: the resident bytes and
// what residency changes in the optimizer wait and the step.
Status print_resident(const PlanConfig& c, const model::ModelConfig& cfg,
                      const std::optional<ExecutorTarget>& exec, const plan::PlanProblem& p0,
                      const plan::Plan& solved) {
  const int k = solved.resident_layers;
  const plan::Prediction& pr = solved.predicted;
  if (k == 0) {
    std::printf("resident layers: 0 (%s)\n", c.resident_layers == plan::kResidentAuto
                                                 ? "none pays or fits at this budget"
                                                 : "--resident-layers 0");
    return ok_status();
  }
  const plan::SolveOptions solve = solve_options(c);
  auto none = for_executor([&](const plan::PlanProblem& q) { return plan::solve_milp(q, solve); },
                           exec, cfg, with_resident(c, 0))(p0);
  std::string change = "no plan fits at K = 0";
  if (none.ok()) {
    change = fmt::format("optimizer wait {:.1f} -> {:.1f} ms, step {:.1f} -> {:.1f} ms vs K = 0",
                         none->predicted.optimizer_wait_ms, pr.optimizer_wait_ms,
                         none->predicted.step_ms, pr.step_ms);
  }
  std::printf("resident layers: %d (0..%d on the gpu, %.3f GB; gpu update %+.1f ms serial; %s)\n",
              k, k - 1, pr.resident_gb, pr.resident_serial_ms, change.c_str());
  return ok_status();
}

// The problem a solved plan is priced with: p0 at the plan's resident K and, when the solve chose
// it (--device-update-layers auto), the plan's tail.
plan::PlanProblem solved_problem(const PlanConfig& c, const plan::PlanProblem& p0,
                                 const plan::Plan& solved) {
  const plan::PlanProblem q = plan::at_resident(p0, solved.resident_layers);
  if (c.device_update_layers != kDeviceUpdateAuto) return q;
  return plan::at_device_tail(q, solved.device_update_layers);
}

// The solved plan's device optimizer tail; with auto, against the same solve at K = 0 (the
// plan's resident K): the staging and what the tail changes in the optimizer wait and the step.
Status print_device_tail(const PlanConfig& c, const model::ModelConfig& cfg,
                         const std::optional<ExecutorTarget>& exec, const plan::PlanProblem& p0,
                         const plan::PlanProblem& p, const plan::Plan& solved) {
  if (c.device_update_layers == 0) return ok_status();
  const int k = solved.device_update_layers;
  if (c.device_update_layers != kDeviceUpdateAuto) {
    std::printf("device optimizer tail: %d (--device-update-layers; optimizer phase %.1f ms)\n", k,
                plan::optimizer_phase_ms(p));
    return ok_status();
  }
  if (!tail_search(c)) {
    std::printf(
        "device optimizer tail: 0 (auto: no device kernel for fp32 master + fp32 states)\n");
    return ok_status();
  }
  if (k == 0) {
    std::printf("device optimizer tail: 0 (auto: no tail is faster or fits at this budget)\n");
    return ok_status();
  }
  const plan::SolveOptions solve = solve_options(c);
  PlanConfig z = with_resident(c, solved.resident_layers);
  z.device_update_layers = 0;
  auto none = for_executor([&](const plan::PlanProblem& q) { return plan::solve_milp(q, solve); },
                           exec, cfg, z)(p0);
  std::string change = "no plan fits at K = 0";
  if (none.ok()) {
    change = fmt::format("optimizer wait {:.1f} -> {:.1f} ms, step {:.1f} -> {:.1f} ms vs K = 0",
                         none->predicted.optimizer_wait_ms, solved.predicted.optimizer_wait_ms,
                         none->predicted.step_ms, solved.predicted.step_ms);
  }
  const int first = solved.resident_layers;
  std::printf(
      "device optimizer tail: %d (auto; layers %d..%d may go to the gpu, staging %.3f GB; "
      "optimizer phase %.1f ms; %s)\n",
      k, first, first + k - 1, plan::device_tail_gpu_gb(p), plan::optimizer_phase_ms(p),
      change.c_str());
  return ok_status();
}

// One more row under the policy table: the fastest fixed policy that fits at the common batch
// with the solved plan's resident layers (cost model only), so that the gain from residency and
// the gain from the plan's activation choices can be told apart. Nothing when the plan has none.
void print_best_fixed_resident(const plan::Comparison& cmp, const plan::PlanProblem& p) {
  if (p.resident_layers == 0) return;
  std::optional<plan::Plan> best;
  std::string best_name;
  for (const plan::PolicyRow& row : cmp.rows) {
    if (row.policy == "solved") continue;
    auto pol = plan::fixed_policy_by_name(row.policy, p.num_layers);
    if (!pol.ok()) continue;
    auto r = plan::solve_policy(p, *pol);
    if (!r.ok() || (best && !(r->predicted.step_ms < best->predicted.step_ms))) continue;
    best = std::move(r).value();
    best_name = row.policy;
  }
  const std::string name = fmt::format("fixed + resident {}", p.resident_layers);
  if (!best) {
    std::printf("%-20s no fixed policy fits with the plan's resident layers\n", name.c_str());
    return;
  }
  const plan::Prediction& q = best->predicted;
  std::printf("%-20s %9.1f %9.1f %11.2f %11.2f | (%s with the plan's resident layers)\n",
              name.c_str(), q.step_ms, q.tflops, q.exposed_ms, q.optimizer_wait_ms,
              best_name.c_str());
}

// A budget above the memory of this machine's GPU plans a run that cannot start here (session 30:
// `--gpu-mem-gb` for 80 GiB on an 80 GB H100, refused by the executor's arena at train time). Said
// as a warning, not refused: a plan may be made here for another machine.
void warn_if_budget_exceeds_device(double gpu_mem_gb) {
  const mem::CudaInfo info = mem::query_cuda_info();
  if (info.devices.empty()) return;
  const mem::CudaDeviceInfo& d = info.devices.front();
  const double device_gb = static_cast<double>(d.total_bytes) / 1e9;
  if (gpu_mem_gb > device_gb) {
    log::get("plan")->warn(
        "--gpu-mem-gb {:.2f} is more than device {} ({}) has, {:.2f} GB (GB = 1e9 bytes): a plan "
        "that uses it will not run on this machine",
        gpu_mem_gb, d.index, d.name, device_gb);
  }
}

Status run_plan_status() {
  PlanConfig& c = plan_config();
  if (c.measure_machine) return run_measure_machine(c);
  if (!c.evaluate.empty()) {
    return run_plan_evaluate({.plan_path = c.evaluate,
                              .bench_path = c.from_bench,
                              .nvme_read_gbps = c.eval_nvme_read_gbps,
                              .nvme_write_gbps = c.eval_nvme_write_gbps,
                              .link_gbps = c.link_gbps,
                              .json_out = c.json_out});
  }
  if (c.eval_nvme_read_gbps > 0 || c.eval_nvme_write_gbps > 0) {
    return invalid_argument("plan: --nvme-read-gbps / --nvme-write-gbps go with --evaluate");
  }
  if (!c.from_bench.empty()) return run_from_bench(c);
  FERRY_TRY(resolve_host_state(c));
  if (!c.nvme_dir.empty() && !std::filesystem::is_directory(c.nvme_dir)) {
    return not_found("plan: --nvme-dir {} is not a directory", c.nvme_dir);
  }
  FERRY_ASSIGN_OR_RETURN(model::ModelConfig cfg, load_geometry(c));
  FERRY_ASSIGN_OR_RETURN(int batch, parse_batch(c.batch));
  if (c.nvme_dir.empty() != (c.nvme_gb <= 0)) {
    return invalid_argument("plan: --nvme-dir and --nvme-gb go together");
  }
  if (c.resident_layers > 0 && !resident_possible(c)) {
    return invalid_argument(
        "plan: --resident-layers {}: GPU-resident layers need 8-bit states or a bf16 master (no "
        "device kernel for fp32 master + fp32 states); give --master / --optimizer-states as the "
        "run's",
        c.resident_layers);
  }
  warn_if_budget_exceeds_device(c.gpu_mem_gb);
  if (c.compare) return run_compare(c, cfg, batch);

  FERRY_ASSIGN_OR_RETURN(const std::optional<ExecutorTarget> exec, executor_of(c));
  FERRY_ASSIGN_OR_RETURN(plan::ProblemAt at, make_problem_at(c, cfg, c.gpu_mem_gb, exec));
  const plan::SolveOptions solve = solve_options(c);
  const plan::SolveOptions probe = probe_options(c);
  const plan::Planner solve_probe = for_executor(
      [&](const plan::PlanProblem& p) { return plan::solve_milp(p, probe); }, exec, cfg, c);
  const plan::Planner solve_diagnosed = for_executor(
      [&](const plan::PlanProblem& p) { return plan::solve_or_diagnose(p, solve); }, exec, cfg, c);
  std::optional<plan::Plan> searched;  // the batch search's plan when it is the full solve's
  if (batch == 0) {
    FERRY_ASSIGN_OR_RETURN(
        plan::BatchSearchResult r,
        plan::largest_batch(at, solve_probe, batch_search_options(c, probe, exec, cfg)));
    batch = r.batch;
    if (probe.time_limit_s == solve.time_limit_s) searched = r.plan;
    const plan::Prediction& pr = r.plan.predicted;
    log::get("plan")->info(
        "batch=auto -> {} (largest fitting {}; gpu idle {:.1f} ms = exposed {:.1f} + optimizer "
        "wait {:.1f} + optimizer bound {:.1f} of a {:.1f} ms step, {} the 2% limit; {} probes)",
        r.batch, r.largest_fitting, pr.idle_ms(), pr.exposed_ms, pr.optimizer_wait_ms,
        pr.optimizer_bound_ms, pr.step_ms, r.exposure_ok ? "within" : "above", r.probes);
  }
  FERRY_ASSIGN_OR_RETURN(plan::PlanProblem p0, at(batch));
  // The same solve (problem, time limit, gap) as the search's last: not repeated.
  FERRY_ASSIGN_OR_RETURN(plan::Plan solved,
                         searched ? Result<plan::Plan>(std::move(*searched)) : solve_diagnosed(p0));
  const plan::PlanProblem p = solved_problem(c, p0, solved);
  FERRY_TRY(log_executor_bytes(p, solved, cfg, exec));
  std::printf("%s", plan::plan_text(p, solved).c_str());
  FERRY_TRY(print_resident(c, cfg, exec, p0, solved));
  FERRY_TRY(print_device_tail(c, cfg, exec, p0, p, solved));
  if (!c.no_policies) {
    plan::CompareOptions o{
        .solve = solve,
        .probe_solve = probe,
        .max_batch = c.max_batch,
        .planner = for_executor(
            [&](const plan::PlanProblem& q) { return plan::solve_milp(q, solve); }, exec, cfg, c),
        .probe_planner = compare_probe(c, probe, exec, cfg)};
    o.solved_at_batch = &solved;
    FERRY_ASSIGN_OR_RETURN(plan::Comparison cmp, plan::compare_policies(at, batch, o));
    std::printf("%s", plan::comparison_text(cmp).c_str());
    print_best_fixed_resident(cmp, p);
  }
  std::fflush(stdout);
  if (!c.json_out.empty()) FERRY_TRY(write_plan_document(c.json_out, solved, p, cfg));
  return ok_status();
}

}  // namespace

Status write_training_plan(const TrainingPlanRequest& r, const std::string& out_path) {
  PlanConfig c;
  c.seq_len = r.seq_len;
  c.gpu_mem_gb = r.gpu_gb;
  c.host_mem_gb = r.host_gb;
  c.nvme_dir = r.nvme_dir;
  c.nvme_gb = r.nvme_dir.empty() ? 0.0 : r.nvme_gb;
  c.master = r.master;
  c.optimizer_states = r.optimizer_states;
  c.grad_dtype = r.grad_dtype;
  c.machine = r.machine;
  c.time_limit_s = r.time_limit_s;
  c.executor_device = r.device;
  c.device_update_layers = r.device_update_layers;
  c.device_update_slots = r.device_update_slots;
  c.device_update_ms_per_layer = r.device_update_ms_per_layer;
  c.no_keep_internals = !r.keep_internals;
  c.resident_layers = r.resident_layers < 0 ? plan::kResidentAuto : r.resident_layers;
  FERRY_TRY(resolve_host_state(c));
  FERRY_ASSIGN_OR_RETURN(const std::optional<ExecutorTarget> exec, executor_of(c));
  FERRY_ASSIGN_OR_RETURN(plan::ProblemAt at, make_problem_at(c, r.config, c.gpu_mem_gb, exec));
  FERRY_ASSIGN_OR_RETURN(plan::PlanProblem p0, at(r.batch_size));
  const plan::SolveOptions solve = solve_options(c);
  FERRY_ASSIGN_OR_RETURN(
      plan::Plan solved,
      for_executor([&](const plan::PlanProblem& q) { return plan::solve_or_diagnose(q, solve); },
                   exec, r.config, c)(p0));
  const plan::PlanProblem p = solved_problem(c, p0, solved);
  FERRY_TRY(log_executor_bytes(p, solved, r.config, exec));
  std::printf("%s", plan::plan_text(p, solved).c_str());
  FERRY_TRY(print_device_tail(c, r.config, exec, p0, p, solved));
  std::fflush(stdout);
  return write_plan_document(out_path, solved, p, r.config);
}

namespace {

int run_plan() {
  const Status s = run_plan_status();
  return s.ok() ? 0 : fail(s);
}

void register_plan(CLI::App& app, CommandFn& run) {
  auto* cmd = app.add_subcommand(
      "plan", "solve the activation checkpoint/placement/transfer schedule of a training step");
  PlanConfig& c = plan_config();
  cmd->add_option("--model", c.model_dir, "Hugging Face model folder (config.json)")
      ->check(CLI::ExistingDirectory)
      ->envname("FERRY_PLAN_MODEL");
  cmd->add_option("--geometry", c.geometry,
                  "built-in geometry instead of --model: qwen2.5-0.5b|1.5b|3b|7b|14b");
  cmd->add_option("--batch-size", c.batch,
                  "sequences per step, or auto (largest that fits with "
                  "exposure <= 2% of the step)")
      ->envname("FERRY_PLAN_BATCH_SIZE");
  cmd->add_option("--seq-len", c.seq_len, "tokens per sequence")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--gpu-mem-gb", c.gpu_mem_gb, "GPU memory budget (GB = 1e9 bytes)")
      ->check(CLI::Range(0.0, 1e6))
      ->envname("FERRY_PLAN_GPU_MEM_GB");
  cmd->add_option("--host-mem-gb", c.host_mem_gb, "host memory budget (GB)")
      ->check(CLI::Range(0.0, 1e6))
      ->envname("FERRY_PLAN_HOST_MEM_GB");
  cmd->add_option("--nvme-dir", c.nvme_dir, "folder of the NVMe activation spill store");
  cmd->add_option("--nvme-gb", c.nvme_gb, "NVMe spill budget (GB)")->check(CLI::Range(0.0, 1e7));
  cmd->add_option("--json", c.json_out, "write the plan (or the --compare report) as JSON here");
  cmd->add_option("--executor-device", c.executor_device,
                  "GPU memory as ferry's stream executor allocates it with this device's kernels: "
                  "auto (cuda when a GPU is present), cpu, cuda, or none (the cost model's bf16 "
                  "estimate)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda", "none"}));
  cmd->add_option("--time-limit-s", c.time_limit_s, "CBC wall-clock limit per solve")
      ->check(CLI::Range(0.1, 86400.0));
  cmd->add_option("--mip-gap", c.mip_gap,
                  "stop a solve when (incumbent - bound) / incumbent is at most this (0: prove "
                  "optimality to 1e-7 ms)")
      ->check(CLI::Range(0.0, 0.1));
  cmd->add_option("--max-span", c.max_span, "longest recomputed span R (layers + 1)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--max-batch", c.max_batch, "upper end of the batch search")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--host-state-bytes-per-param", c.host_state_bytes_per_param,
                  "host bytes per parameter of model state (16: fp32 master + fp32 AdamW)")
      ->check(CLI::Range(2.0, 64.0));
  cmd->add_option("--master", c.master,
                  "master weights fp32|bf16-kahan|bf16-sr: sets the host bytes/param (with "
                  "--optimizer-states) as ferry train would use them");
  cmd->add_option("--optimizer-states", c.optimizer_states,
                  "AdamW states fp32|8bit (see --master)");
  cmd->add_option("--grad-dtype", c.grad_dtype,
                  "gradients as ferry train --grad-dtype keeps them: f32 (default) or bf16 (host "
                  "bytes/param with --master/--optimizer-states, and the executor's GPU twins)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--device-update-layers", c.device_update_layers,
                  "ferry train's device optimizer tail in the optimizer gate: the device updates "
                  "layers 0, 1, ... (at most K) while the CPU, after the globals, updates L-1, "
                  "L-2, ... until they meet; all: no limit; 0 (default): the CPU updates all; "
                  "auto: the solve picks K, the fastest predicted step (ties: the smaller K; 0 "
                  "with fp32 master + fp32 states, which have no device kernel), written to the "
                  "plan for ferry train --plan. Its staging counts as GPU memory unless "
                  "--executor-device none")
      ->envname("FERRY_DEVICE_UPDATE_LAYERS")
      ->transform(layers_or_all(true));
  cmd->add_option("--device-update-slots", c.device_update_slots,
                  "ferry train's --device-update-slots: each staging slot holds one layer's "
                  "optimizer sections in GPU memory (with --device-update-layers)")
      ->envname("FERRY_DEVICE_UPDATE_SLOTS")
      ->check(CLI::Range(1, train::stream::kMaxDeviceUpdateSlots));
  add_device_update_ms_flag(cmd, c.device_update_ms_per_layer, "");
  cmd->add_option("--resident-layers", c.resident_layers,
                  "GPU-resident layers (ferry train --resident-layers): K forces layers 0..K-1 "
                  "resident; auto (default): the solve picks the K of the fastest predicted step "
                  "that fits (docs/plan.md, resident layers)")
      ->transform(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "auto") {
              v = std::to_string(plan::kResidentAuto);
              return {};
            }
            try {
              std::size_t used = 0;
              if (std::stoi(v, &used) >= 0 && used == v.size()) return {};
            } catch (const std::exception&) {
            }
            return "expected a layer count >= 0 or auto, got " + v;
          },
          "K|auto"));
  cmd->add_option("--resident-update-ms-per-layer", c.resident_update_ms_per_layer,
                  "the GPU update of one resident layer (measured); 0: assumed 1 ms per resident "
                  "GB (the device tail's kernels, 0.8 ms per Qwen2.5-3B layer on an H200)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--profile", c.profile, "measured cost profile JSON (docs/plan.md)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--machine", c.machine, "machine name for defaults and the profile cache");
  cmd->add_option("--link-gbps", c.link_gbps,
                  "what-if: host<->GPU rate per direction (duplex 1.8x, under optimizer load 1.5x)")
      ->check(CLI::Range(0.1, 1000.0));
  cmd->add_flag("--compare", c.compare, "print solved plan vs fixed policies per GPU cap as JSON");
  cmd->add_option("--gpu-caps", c.gpu_caps, "GPU caps for --compare, comma-separated GB");
  cmd->add_flag("--no-policies", c.no_policies, "skip the fixed-policy comparison");
  cmd->add_flag("--no-keep-internals", c.no_keep_internals,
                "keep no layer's internals between its forward and backward (every backward "
                "re-runs its layer's forward, as the fixed policies do)");
  cmd->add_flag("--measure-machine", c.measure_machine,
                "measure this machine's link, NVMe, GEMM, attention and CPU-optimizer rates "
                "(with --nvme-dir for NVMe) and cache them for --machine");
  cmd->add_option("--nvme-record-mib", c.nvme_record_mib,
                  "with --measure-machine --nvme-dir: NVMe records of this size, moved one at a "
                  "time as the training executor moves its boundaries (one f32 boundary is "
                  "batch x seq x hidden x 4 bytes; default 256 = 3B at 32 x 1024)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20));
  cmd->add_option("--nvme-measure-mib", c.nvme_measure_mib,
                  "with --measure-machine --nvme-dir: MiB written then read back per pass, in "
                  "records of --nvme-record-mib (at least one record; default 1024)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30));
  cmd->add_option("--from-bench", c.from_bench,
                  "a `ferry bench train --json` report: its device run as a measured profile, and "
                  "each benched policy's measured step next to the plan's prediction")
      ->check(CLI::ExistingFile);
  cmd->add_option("--from-bench-resident", c.from_bench_resident,
                  "with --from-bench: a second report of the same model and batch whose device run "
                  "kept GPU-resident layers (--resident-layers K|auto): the measured saving of "
                  "each resident layer beyond the model's (the profile's resident_saved_ms)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--write-profile", c.write_profile,
                  "with --from-bench: write that profile here (auto: the cache for --machine)");
  cmd->add_option("--evaluate", c.evaluate,
                  "a ferry plan --json document: price that plan again, without re-solving, at "
                  "the rates given by --nvme-read-gbps / --nvme-write-gbps, --link-gbps or the "
                  "disk rates the executor measured in a --from-bench report (with its measured "
                  "step beside the prediction when the report ran the plan)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--nvme-read-gbps", c.eval_nvme_read_gbps,
                  "with --evaluate: the NVMe read rate to price the plan at (GB/s)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--nvme-write-gbps", c.eval_nvme_write_gbps,
                  "with --evaluate: the NVMe write rate to price the plan at (GB/s)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--machine-profile", c.machine_profile,
                  "machine profile JSON to use (default: the cached one for --machine), or to "
                  "write with --measure-machine");
  cmd->callback([&run, cmd] {
    run = run_plan;
    plan_config().host_state_bytes_given = cmd->count("--host-state-bytes-per-param") > 0;
    if (plan_config().measure_machine || !plan_config().from_bench.empty() ||
        !plan_config().evaluate.empty()) {
      return;
    }
    if (!plan_config().compare && cmd->count("--gpu-mem-gb") == 0) {
      throw CLI::RequiredError("--gpu-mem-gb");
    }
    if (cmd->count("--host-mem-gb") == 0) throw CLI::RequiredError("--host-mem-gb");
  });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_plan);
}  // namespace ferry::app
