// SPDX-License-Identifier: Apache-2.0
#include "plan/bench_profile.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/file_util.h"
#include "plan/evaluate.h"
#include "plan/policies.h"
#include "plan/resident.h"

namespace ferry::plan {

namespace {

const Json* find_policy(const Json& report, const std::string& name) {
  for (const Json& p : report.at("policies")) {
    if (p.value("policy", "") == name && !p.contains("error")) return &p;
  }
  return nullptr;
}

// Measured window time minus exposed time, window t.
double compute_ms(const Json& windows, int t) {
  return windows.at("measured_ms").at(t).get<double>() -
         windows.at("measured_exposed_ms").at(t).get<double>();
}

Result<Plan> price_policy(const PlanProblem& problem, const std::string& plan_name) {
  FERRY_ASSIGN_OR_RETURN(const FixedPolicy fp, fixed_policy_by_name(plan_name, problem.num_layers));
  return solve_policy(problem, fp);
}

// The host-home term (PlanProblem::host_home_ms_per_gb) from the report's device and host runs at
// one batch: what the host run measured beyond the device run, less what the model already
// predicts between them (problem: the profile without the term), per GB of boundaries the host run
// homed off the GPU, clamped at >= 0. The GB homed: act_bytes_per_step / 2 (the bench counts both
// directions; every homed boundary goes out once and comes back once), in the planner's unit (f32
// boundaries of B x S x hidden, PlanProblem::boundary_gb): L boundaries, 0..L-1, as the
// executor's host policy and the planner's all-host both home them. Without a host run at the
// device run's batch: 0 and an empty measured_by.
Status measure_host_home(const Json& report, const Json& dev, const PlanProblem& problem,
                         Profile& prof) {
  prof.host_home_ms_per_gb = 0;
  prof.host_home_measured_by.clear();
  const Json* host = find_policy(report, "host");
  if (host == nullptr) return ok_status();
  const int batch = report.at("batch").get<int>();
  if (host->value("batch_size", batch) != dev.value("batch_size", batch)) return ok_status();
  const double homed_gb = host->value("act_bytes_per_step", 0.0) / 2 / 1e9;
  if (!(homed_gb > 0)) return ok_status();
  FERRY_ASSIGN_OR_RETURN(const Plan pd, price_policy(problem, "all-gpu"));
  FERRY_ASSIGN_OR_RETURN(const Plan ph, price_policy(problem, "all-host"));
  const double dev_ms = dev.at("step_ms_mean").get<double>();
  const double host_ms = host->at("step_ms_mean").get<double>();
  const double modelled_ms = ph.predicted.step_ms - pd.predicted.step_ms;
  const double extra_ms = host_ms - dev_ms - modelled_ms;
  prof.host_home_ms_per_gb = std::max(0.0, extra_ms) / homed_gb;
  prof.host_home_measured_by = fmt::format(
      "ferry bench train on {}: host {:.1f} ms - device {:.1f} ms at batch {} ({} timed steps), "
      "{:+.1f} ms of it modelled, {:+.1f} ms unmodelled over {:.2f} GB homed{}",
      report.value("device", "?"), host_ms, dev_ms, batch, report.at("steps").get<int>(),
      modelled_ms, extra_ms, homed_gb, extra_ms < 0 ? " (clamped at 0)" : "");
  return ok_status();
}

// The resident-saving term (PlanProblem::resident_saved_ms) from the device run at K = 0 and a
// device run with R > 0 resident layers at the same batch (`resident` report): what the resident
// run measured faster beyond the model's own difference between the two (problem: the profile
// without the term, priced all-gpu at K = 0 and at R), per layer made resident, clamped at >= 0.
Status measure_resident_saved(const Json& report, const Json& dev, const Json& resident,
                              const PlanProblem& problem, Profile& prof) {
  prof.resident_saved_ms = 0;
  prof.resident_saved_measured_by.clear();
  const Json* rdev = find_policy(resident, "device");
  if (rdev == nullptr) {
    return invalid_argument("plan: the resident-layers report has no successful `device` run");
  }
  const int R = rdev->value("resident_layers", 0);
  if (R <= 0) {
    return invalid_argument(
        "plan: the resident-layers report's device run kept no layer resident (bench it with "
        "--resident-layers K or auto)");
  }
  if (rdev->value("batch_size", -1) != dev.value("batch_size", -2) ||
      resident.value("seq", -1) != report.value("seq", -2) ||
      resident.value("arch", std::string("qwen3")) != report.value("arch", std::string("qwen3")) ||
      resident.value("geometry", Json()) != report.value("geometry", Json())) {
    return invalid_argument(
        "plan: the resident-layers report is of another model, batch or sequence length than "
        "the profile's report");
  }
  FERRY_ASSIGN_OR_RETURN(const FixedPolicy fp, fixed_policy_by_name("all-gpu", problem.num_layers));
  FERRY_ASSIGN_OR_RETURN(const Plan p0, solve_policy(problem, fp));
  FERRY_ASSIGN_OR_RETURN(const Plan pr, solve_policy(at_resident(problem, R), fp));
  const double dev_ms = dev.at("step_ms_mean").get<double>();
  const double res_ms = rdev->at("step_ms_mean").get<double>();
  const double modelled_ms = p0.predicted.step_ms - pr.predicted.step_ms;
  const double extra_ms = dev_ms - res_ms - modelled_ms;
  prof.resident_saved_ms = std::max(0.0, extra_ms) / R;
  prof.resident_saved_measured_by = fmt::format(
      "ferry bench train on {}: device {:.1f} ms at K = 0 - {:.1f} ms at K = {} resident layers, "
      "batch {} ({} / {} timed steps), {:+.1f} ms of it modelled, {:+.1f} ms unmodelled{}",
      report.value("device", "?"), dev_ms, res_ms, R, dev.value("batch_size", 0),
      report.at("steps").get<int>(), resident.at("steps").get<int>(), modelled_ms, extra_ms,
      extra_ms < 0 ? " (clamped at 0)" : "");
  return ok_status();
}

double number_or(const Json& run, const char* key, double fallback) {
  const auto it = run.find(key);
  return it != run.end() && it->is_number() ? it->get<double>() : fallback;
}

}  // namespace

Result<Json> read_bench_report(const std::string& path, const char* flag) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  Result<Json> report = parse_json(text, fmt::format("{} {}", flag, path));
  if (!report.ok()) return report.status();
  if (!report->is_object() || report->value("bench", "") != "train") {
    return invalid_argument("plan: {} {} is not a `ferry bench train` report", flag, path);
  }
  const auto policies = report->find("policies");
  if (policies == report->end() || !policies->is_array()) {
    return corrupt("plan: {} {}: no \"policies\" array (a cut or edited report?)", flag, path);
  }
  return report;
}

std::optional<ExecutorDiskRates> executor_disk_rates(const Json& report) {
  const Json* best = nullptr;
  for (const Json& run : report.at("policies")) {
    if (run.contains("error")) continue;
    if (!(number_or(run, "nvme_write_gbps", 0) > 0 && number_or(run, "nvme_read_gbps", 0) > 0)) {
      continue;
    }
    if (best == nullptr || number_or(run, "nvme_write_bytes_per_step", 0) >
                               number_or(*best, "nvme_write_bytes_per_step", 0)) {
      best = &run;
    }
  }
  if (best == nullptr) return std::nullopt;
  return ExecutorDiskRates{
      .policy = best->value("policy", "?"),
      .write_gbps = number_or(*best, "nvme_write_gbps", 0),
      .read_gbps = number_or(*best, "nvme_read_gbps", 0),
      .write_bytes_per_step = number_or(*best, "nvme_write_bytes_per_step", 0)};
}

namespace {

// The disk as the executor used it (executor_disk_rates): the profile's NVMe rates in place of the
// machine's (on one H100 machine the machine profile's back-to-back passes rated the disk 11-26 %
// below what the executor's own calls got; docs/plan.md, session 32). Without such a run: the
// machine's rates.
void measure_nvme_rates(const Json& report, Profile& prof) {
  const std::optional<ExecutorDiskRates> d = executor_disk_rates(report);
  if (!d) return;
  prof.link.nvme_write_gbps = d->write_gbps;
  prof.link.nvme_read_gbps = d->read_gbps;
  prof.measured_by += fmt::format(
      "; NVMe rates: the executor's disk calls in policy {} (write {:.2f} GB/s, read {:.2f} GB/s "
      "over {:.2f} GB per step each way)",
      d->policy, d->write_gbps, d->read_gbps, d->write_bytes_per_step / 1e9);
}

// The device optimizer tail as measured (Profile::device_update_*): from the first policy run of
// the report whose tail updated layers (a plan=FILE policy solved with a tail, or every policy of
// a bench given --device-update-layers K|all), the device's time per layer it updated, as the
// gate's simulation uses it (one layer after another at the device's pace): the tail's busy time
// over its units (with S > 1 slots the units overlap, so one unit's own time from its H2D to its
// D2H, device_update_unit_ms_mean, is longer than the pace: 71 vs 43 ms at 7B on the H200 with
// S = 2), or, in a report without the busy time, that unit mean; and its H2D bytes per unit.
// The device run itself must not have run the tail: its CPU optimizer times would then cover only
// the layers the CPU took.
Status measure_device_tail(const Json& report, const Json& dev, Profile& prof) {
  prof.device_update_ms_per_layer = 0;
  prof.device_update_h2d_gb_per_layer = 0;
  prof.device_update_measured_by.clear();
  if (number_or(dev, "device_update_units", 0) > 0) {
    return invalid_argument(
        "plan: the bench report's device run updated {} layers per step on the GPU (a device "
        "optimizer tail): its CPU optimizer times cover only the layers the CPU took; profile from "
        "a device run without the tail (ferry bench train without --device-update-layers runs "
        "none on the named policies) and bench the tail in a plan=FILE policy beside it",
        number_or(dev, "device_update_units_per_step", 0));
  }
  for (const Json& run : report.at("policies")) {
    if (run.contains("error")) continue;
    const double units = number_or(run, "device_update_units", 0);
    if (!(units > 0)) continue;
    const double busy_s = number_or(run, "device_update_busy_s", 0);
    const double unit_ms = number_or(run, "device_update_unit_ms_mean", 0);
    const double ms = busy_s > 0 ? busy_s * 1e3 / units : unit_ms;
    if (!(ms > 0)) continue;
    prof.device_update_ms_per_layer = ms;
    prof.device_update_h2d_gb_per_layer =
        number_or(run, "device_update_h2d_bytes", 0) / units / 1e9;
    prof.device_update_measured_by = fmt::format(
        "ferry bench train on {}: policy {}, {:.0f} device units in {} steps with {} staging "
        "slots; {} -> {:.2f} ms per layer (one unit {:.2f} ms from its H2D to its D2H: H2D "
        "{:.2f}, kernels {:.2f}, D2H {:.2f}), {:.3f} GB H2D per unit",
        report.value("device", "?"), run.value("policy", "?"), units,
        report.at("steps").get<int>() + report.at("warmup").get<int>(),
        number_or(run, "device_update_slots", 0),
        busy_s > 0 ? fmt::format("busy {:.3f} s over the units", busy_s)
                   : std::string("no busy time: the unit mean"),
        ms, unit_ms, number_or(run, "device_update_unit_h2d_ms_mean", 0),
        number_or(run, "device_update_unit_kernel_ms_mean", 0),
        number_or(run, "device_update_unit_d2h_ms_mean", 0), prof.device_update_h2d_gb_per_layer);
    return ok_status();
  }
  return ok_status();
}

}  // namespace

std::string plan_policy_name(const std::string& p) {
  if (p == "device") return "all-gpu";
  if (p == "host") return "all-host";
  if (p.rfind("every:", 0) == 0 && p.find(':', 6) == std::string::npos) {
    return "checkpoint-every-" + p.substr(6);
  }
  return "";
}

Result<BenchPrediction> predict_bench(const Json& report, const model::ModelConfig& cfg,
                                      const MachineSpec& machine, const Json* resident_report) {
  const int L = static_cast<int>(cfg.num_hidden_layers);
  const Json* dev = find_policy(report, "device");
  if (dev == nullptr) {
    return invalid_argument(
        "plan: the bench report has no successful `device` policy run (the profile is taken "
        "from the all-on-GPU run; bench with --policies device,...)");
  }
  if (dev->value("resident_layers", 0) != 0) {
    return invalid_argument(
        "plan: the bench report's device run kept {} layers resident; profile from a run without "
        "(--resident-layers 0; a resident run goes in --from-bench-resident)",
        dev->value("resident_layers", 0));
  }
  const Json& w = dev->at("windows");
  if (static_cast<int>(w.at("measured_ms").size()) != 2 * L + 1) {
    return invalid_argument("plan: the bench report has {} windows, the model {} layers",
                            w.at("measured_ms").size(), L);
  }
  if (report.value("batch_auto", false)) {
    return invalid_argument(
        "plan: the bench report chose each policy's batch (--batch-size auto); profile from a "
        "run at one fixed --batch-size");
  }
  if (report.value("grad_accum", 1) != 1) {
    return invalid_argument(
        "plan: the bench report accumulates {} micro-batches per step; profile from a run with "
        "--grad-accum 1 (its windows are one micro-batch's)",
        report.value("grad_accum", 1));
  }
  const int batch = report.at("batch").get<int>();
  const int seq = report.at("seq").get<int>();
  const int steps = report.at("steps").get<int>(), warmup = report.at("warmup").get<int>();

  BenchPrediction out;
  Profile& prof = out.profile;
  prof.machine = machine.name;
  prof.geometry = geometry_key(cfg);
  prof.batch_size = batch;
  prof.seq_len = seq;
  prof.measured_by = fmt::format("ferry bench train on {} (policy device, {} timed steps)",
                                 report.value("device", "?"), steps);
  prof.link = machine.link;
  measure_nvme_rates(report, prof);
  double windows_ms = 0;
  for (int j = 0; j < L; ++j) {
    const double f = compute_ms(w, j), b = compute_ms(w, 2 * L - j);
    // The backward window contains the internals-only re-forward (measured inside b); what a keep
    // saves is the forward's FLOP share of it (cost_model.h reforward_flop_share).
    prof.layers.push_back({.fwd_ms = f,
                           .bwd_ms = b,
                           .rec_ms = f,
                           .reforward_ms = f * reforward_flop_share(cfg, j, seq)});
  }
  prof.loss_ms = compute_ms(w, L);
  for (const Json& v : w.at("measured_ms")) windows_ms += v.get<double>();
  prof.cpu_optimizer_ms =
      dev->at("optimizer_busy_s").get<double>() * 1e3 / static_cast<double>(steps + warmup);
  // Each layer's update as the bench measured it (reports before per-unit times have none).
  prof.optimizer_layer_ms = dev->value("optimizer_layer_ms", std::vector<double>{});
  if (!prof.optimizer_layer_ms.empty() && static_cast<int>(prof.optimizer_layer_ms.size()) != L) {
    return corrupt("plan: the bench report has {} per-layer optimizer times for {} layers",
                   prof.optimizer_layer_ms.size(), L);
  }
  out.serial_ms = std::max(0.0, dev->at("step_ms_mean").get<double>() - windows_ms);
  FERRY_TRY(measure_device_tail(report, *dev, prof));

  const TrainShape shape{.batch_size = batch,
                         .seq_len = seq,
                         .grad_bytes_per_param = 4,
                         .weight_bytes_per_param = 4,
                         .activation_bytes = 4};
  const Capacities caps{.gpu_gb = 1e6, .host_gb = 1e6, .nvme_gb = 0};
  FERRY_ASSIGN_OR_RETURN(PlanProblem problem, analytic_problem(cfg, machine, shape, caps));
  FERRY_TRY(apply_profile(prof, problem));
  // The serial part as measured, plus layer 0's update, which the model counts as serial
  // (step_fixed_ms) while the executor waits for it inside window f0.
  double total_w = 0;
  for (const LayerCost& lc : problem.layers) total_w += lc.weight_gb;
  problem.step_fixed_ms =
      out.serial_ms + (prof.optimizer_layer_ms.empty()
                           ? prof.cpu_optimizer_ms * problem.layers[0].weight_gb / total_w
                           : prof.optimizer_layer_ms[0]);
  FERRY_TRY(measure_host_home(report, *dev, problem, prof));
  if (resident_report != nullptr) {
    // Fitted with the host-home term at 0, as that one is (the device runs home nothing off the
    // GPU, so the order does not matter).
    FERRY_TRY(measure_resident_saved(report, *dev, *resident_report, problem, prof));
  }
  problem.host_home_ms_per_gb = prof.host_home_ms_per_gb;
  problem.resident_saved_ms = prof.resident_saved_ms;
  for (const Json& p : report.at("policies")) {
    const std::string name = p.value("policy", "");
    const std::string plan_name = plan_policy_name(name);
    if (plan_name.empty() || p.contains("error")) continue;
    FERRY_ASSIGN_OR_RETURN(const Plan plan, price_policy(problem, plan_name));
    const Prediction& pr = plan.predicted;
    out.checks.push_back({.policy = name,
                          .plan_policy = plan_name,
                          .measured_ms = p.at("step_ms_mean").get<double>(),
                          .predicted_ms = pr.step_ms,
                          .measured_exposed_ms = p.at("exposed_ms_per_step").get<double>(),
                          .predicted_exposed_ms = pr.idle_ms()});
  }
  return out;
}

Json to_json(const BenchPrediction& b) {
  Json checks = Json::array();
  for (const BenchCheck& c : b.checks) {
    checks.push_back({{"policy", c.policy},
                      {"plan_policy", c.plan_policy},
                      {"measured_step_ms", c.measured_ms},
                      {"predicted_step_ms", c.predicted_ms},
                      {"error", c.error()},
                      {"measured_exposed_ms", c.measured_exposed_ms},
                      {"predicted_exposed_ms", c.predicted_exposed_ms}});
  }
  return {{"what", "plan predictions under the profile measured by the bench's device run"},
          {"profile", to_json(b.profile)},
          {"serial_ms", b.serial_ms},
          {"checks", checks}};
}

std::string bench_prediction_text(const BenchPrediction& b) {
  std::string s =
      fmt::format("profile from {} | serial part {:.1f} ms | cpu optimizer {:.1f} ms/step\n",
                  b.profile.measured_by, b.serial_ms, b.profile.cpu_optimizer_ms);
  s += fmt::format("host homes: {}\n", host_home_text(b.profile));
  s += fmt::format("resident saving: {}\n", resident_saved_text(b.profile));
  s += fmt::format("device optimizer tail: {}\n", device_update_text(b.profile));
  if (!b.profile.host_home_measured_by.empty()) {
    s += "(the host policy's prediction below includes the term fitted to it: not a check)\n";
  } else {
    s += "(no host run at the device run's batch: bench with --policies device,host to measure "
         "it)\n";
  }
  s += fmt::format("{:<10} {:<20} {:>12} {:>13} {:>8} {:>12} {:>13}\n", "policy", "plan policy",
                   "measured ms", "predicted ms", "error", "exposed ms", "predicted exp");
  for (const BenchCheck& c : b.checks) {
    s += fmt::format("{:<10} {:<20} {:>12.1f} {:>13.1f} {:>+7.1f}% {:>12.1f} {:>13.1f}\n", c.policy,
                     c.plan_policy, c.measured_ms, c.predicted_ms, 100 * c.error(),
                     c.measured_exposed_ms, c.predicted_exposed_ms);
  }
  return s;
}

}  // namespace ferry::plan
