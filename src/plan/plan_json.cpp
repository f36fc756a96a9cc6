// SPDX-License-Identifier: Apache-2.0
#include "plan/plan_json.h"

#include <algorithm>
#include <cstdint>

#include "core/file_util.h"
#include "core/json_flags.h"

namespace ferry::plan {
namespace {

constexpr int kVersion = 1;

Result<Home> home_from_string(const std::string& s) {
  for (Home h : {Home::kGpu, Home::kHost, Home::kNvme, Home::kRecompute}) {
    if (s == to_string(h)) return h;
  }
  return corrupt("plan: unknown home \"{}\"", s);
}

Prediction prediction_from_json(const Json& j) {
  Prediction r;
  r.step_ms = j.at("step_ms").get<double>();
  r.gpu_step_ms = j.at("gpu_step_ms").get<double>();
  // Absent in plans written before the optimizer terms existed.
  r.optimizer_wait_ms = j.value("optimizer_wait_ms", 0.0);
  r.optimizer_bound_ms = j.value("optimizer_bound_ms", 0.0);
  r.host_home_ms = j.value("host_home_ms", 0.0);            // absent before the host-home term
  r.resident_saved_ms = j.value("resident_saved_ms", 0.0);  // absent before its term
  r.compute_ms = j.at("compute_ms").get<double>();
  r.recompute_ms = j.at("recompute_ms").get<double>();
  r.exposed_ms = j.at("exposed_ms").get<double>();
  r.objective_ms = j.at("objective_ms").get<double>();
  r.moved_gb = j.at("moved_gb").get<double>();
  r.kept_internals_gb = j.value("kept_internals_gb", 0.0);  // absent before the keep choice
  r.resident_gb = j.value("resident_gb", 0.0);              // absent before resident layers
  r.resident_serial_ms = j.value("resident_serial_ms", 0.0);
  r.device_tail_serial_ms = j.value("device_tail_serial_ms", 0.0);  // absent before the term
  r.gpu_peak_gb = j.at("gpu_peak_gb").get<double>();
  r.gpu_peak_window = j.at("gpu_peak_window").get<int>();
  r.host_peak_gb = j.at("host_peak_gb").get<double>();
  // Absent before the NVMe bounce buffer was counted (such a plan's host_peak_gb lacks it).
  r.nvme_bounce_gb = j.value("nvme_bounce_gb", 0.0);
  // Absent before the bounce buffer's timing was modelled.
  r.nvme_store_ms = j.value("nvme_store_ms", 0.0);
  r.nvme_fetch_ms = j.value("nvme_fetch_ms", 0.0);
  r.nvme_peak_gb = j.at("nvme_peak_gb").get<double>();
  r.tflops = j.at("tflops").get<double>();
  r.window_compute_ms = j.at("window_compute_ms").get<std::vector<double>>();
  r.window_exposed_ms = j.at("window_exposed_ms").get<std::vector<double>>();
  r.window_gpu_gb = j.at("window_gpu_gb").get<std::vector<double>>();
  r.window_optimizer_wait_ms = j.contains("window_optimizer_wait_ms")
                                   ? j.at("window_optimizer_wait_ms").get<std::vector<double>>()
                                   : std::vector<double>(r.window_gpu_gb.size(), 0.0);
  return r;
}

}  // namespace

Json prediction_to_json(const Prediction& r) {
  return {{"step_ms", r.step_ms},
          {"gpu_step_ms", r.gpu_step_ms},
          {"optimizer_wait_ms", r.optimizer_wait_ms},
          {"optimizer_bound_ms", r.optimizer_bound_ms},
          {"host_home_ms", r.host_home_ms},
          {"resident_saved_ms", r.resident_saved_ms},
          {"idle_ms", r.idle_ms()},
          {"compute_ms", r.compute_ms},
          {"recompute_ms", r.recompute_ms},
          {"exposed_ms", r.exposed_ms},
          {"objective_ms", r.objective_ms},
          {"moved_gb", r.moved_gb},
          {"kept_internals_gb", r.kept_internals_gb},
          {"resident_gb", r.resident_gb},
          {"resident_serial_ms", r.resident_serial_ms},
          {"device_tail_serial_ms", r.device_tail_serial_ms},
          {"gpu_peak_gb", r.gpu_peak_gb},
          {"gpu_peak_window", r.gpu_peak_window},
          {"host_peak_gb", r.host_peak_gb},  // every window's: nvme_bounce_gb included
          {"nvme_bounce_gb", r.nvme_bounce_gb},
          {"nvme_store_ms", r.nvme_store_ms},
          {"nvme_fetch_ms", r.nvme_fetch_ms},
          {"nvme_peak_gb", r.nvme_peak_gb},
          {"tflops", r.tflops},
          {"window_compute_ms", r.window_compute_ms},
          {"window_exposed_ms", r.window_exposed_ms},
          {"window_gpu_gb", r.window_gpu_gb},
          {"window_optimizer_wait_ms", r.window_optimizer_wait_ms}};
}

Json plan_to_json(const Plan& plan, const PlanProblem* problem) {
  Json boundaries = Json::array();
  for (std::size_t i = 0; i < plan.homes.size(); ++i) {
    boundaries.push_back({{"boundary", i}, {"home", to_string(plan.homes[i])}});
  }
  Json spans = Json::array();
  for (const Span& s : plan.spans) {
    spans.push_back({{"start", s.start}, {"end", s.end}, {"keep_weights", s.keep_weights}});
  }
  // Always L numbers 0/1 (the executor's plan_policy.cpp reads them), zeros when none is kept.
  Json keep = Json::array();
  for (int l = 0; l < plan.num_layers; ++l) keep.push_back(plan.keeps(l) ? 1 : 0);
  Json transfers = Json::array();
  for (const Transfer& t : plan.transfers) {
    transfers.push_back({{"boundary", t.boundary},
                         {"window", t.window},
                         {"direction", t.to_gpu ? "h2d" : "d2h"},
                         {"tier", t.nvme ? "nvme" : "host"},
                         {"gb", t.gb}});
  }
  Json j = {{"format", "ferry-plan"},
            {"version", kVersion},
            {"policy", plan.policy},
            {"num_layers", plan.num_layers},
            {"batch_size", plan.batch_size},
            {"seq_len", plan.seq_len},
            {"boundaries", boundaries},
            {"spans", spans},
            {"keep_internals", keep},
            // Decoder layers 0..K-1 GPU-resident (ferry train --resident-layers K).
            {"resident_layers", plan.resident_layers},
            // The device optimizer tail (ferry train --device-update-layers K; 0: the CPU).
            {"device_update_layers", plan.device_update_layers},
            {"transfers", transfers},
            {"predicted", prediction_to_json(plan.predicted)},
            {"solver",
             {{"solver", plan.solver.solver},
              {"status", plan.solver.status},
              {"objective_ms", plan.solver.objective_ms},
              {"bound_ms", plan.solver.bound_ms},
              {"gap", plan.solver.gap},
              {"seconds", plan.solver.seconds}}}};
  if (problem != nullptr) {
    j["problem"] = to_json(*problem);
    // The step's optimizer floor (the CPU's update, or with the device tail the later side's end):
    // the problem's, not the plan's, so written with it but not read back into Prediction.
    j["predicted"]["optimizer_phase_ms"] = optimizer_phase_ms(*problem);
  }
  return j;
}

Result<Plan> plan_from_json(const Json& j) {
  try {
    if (j.at("format").get<std::string>() != "ferry-plan") {
      return corrupt("plan: not a ferry-plan document");
    }
    if (const int v = j.at("version").get<int>(); v != kVersion) {
      return corrupt("plan: plan version {} (this build reads {})", v, kVersion);
    }
    Plan plan;
    plan.policy = j.at("policy").get<std::string>();
    plan.num_layers = j.at("num_layers").get<int>();
    plan.batch_size = j.at("batch_size").get<int>();
    plan.seq_len = j.at("seq_len").get<int>();
    for (const Json& b : j.at("boundaries")) {
      if (b.at("boundary").get<std::size_t>() != plan.homes.size()) {
        return corrupt("plan: boundaries out of order");
      }
      FERRY_ASSIGN_OR_RETURN(Home h, home_from_string(b.at("home").get<std::string>()));
      plan.homes.push_back(h);
    }
    for (const Json& s : j.at("spans")) {
      plan.spans.push_back(
          Span{s.at("start").get<int>(), s.at("end").get<int>(), s.at("keep_weights").get<bool>()});
    }
    // Absent before the keep choice (nothing kept). 0/1 or false/true; all false reads as empty,
    // the form the solvers write.
    if (j.contains("keep_internals")) {
      FERRY_ASSIGN_OR_RETURN(
          std::vector<bool> keep,
          flag_array(j.at("keep_internals"), static_cast<std::size_t>(plan.num_layers),
                     "plan: keep_internals"));
      if (std::find(keep.begin(), keep.end(), true) != keep.end()) {
        plan.keep_internals = std::move(keep);
      }
    }
    plan.resident_layers = j.value("resident_layers", 0);  // absent before resident layers
    if (plan.resident_layers < 0 || plan.resident_layers > plan.num_layers) {
      return corrupt("plan: resident_layers {} of {} layers", plan.resident_layers,
                     plan.num_layers);
    }
    // Absent before the tail was a plan's choice: the tail its problem was solved with.
    if (j.contains("device_update_layers")) {
      plan.device_update_layers = j.at("device_update_layers").get<int>();
    } else if (j.contains("problem") && j.at("problem").is_object()) {
      plan.device_update_layers = std::clamp(j.at("problem").value("device_update_layers", 0), 0,
                                             plan.num_layers - plan.resident_layers);
    }
    if (plan.device_update_layers < 0 ||
        plan.device_update_layers > plan.num_layers - plan.resident_layers) {
      return corrupt("plan: device_update_layers {} of {} non-resident layers",
                     plan.device_update_layers, plan.num_layers - plan.resident_layers);
    }
    for (const Json& t : j.at("transfers")) {
      const std::string dir = t.at("direction").get<std::string>();
      const std::string tier = t.at("tier").get<std::string>();
      if ((dir != "h2d" && dir != "d2h") || (tier != "host" && tier != "nvme")) {
        return corrupt("plan: transfer direction \"{}\" / tier \"{}\"", dir, tier);
      }
      plan.transfers.push_back(Transfer{t.at("boundary").get<int>(), t.at("window").get<int>(),
                                        dir == "h2d", tier == "nvme", t.at("gb").get<double>()});
    }
    plan.predicted = prediction_from_json(j.at("predicted"));
    const Json& s = j.at("solver");
    plan.solver.solver = s.at("solver").get<std::string>();
    plan.solver.status = s.at("status").get<std::string>();
    plan.solver.objective_ms = s.at("objective_ms").get<double>();
    plan.solver.bound_ms = s.at("bound_ms").get<double>();
    plan.solver.gap = s.at("gap").get<double>();
    plan.solver.seconds = s.at("seconds").get<double>();
    return plan;
  } catch (const Json::exception& e) {
    return corrupt("plan: plan json: {}", e.what());
  }
}

Result<std::optional<PlanProblem>> plan_problem_from_json(const Json& j) {
  if (!j.contains("problem")) return std::optional<PlanProblem>{};
  FERRY_ASSIGN_OR_RETURN(PlanProblem p, problem_from_json(j.at("problem")));
  return std::optional<PlanProblem>{std::move(p)};
}

Status write_plan_file(const std::string& path, const Plan& plan, const PlanProblem* problem) {
  return write_file_atomic(path, plan_to_json(plan, problem).dump(1) + "\n");
}

Result<Plan> read_plan_file(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  FERRY_ASSIGN_OR_RETURN(Json j, parse_json(text, path));
  return plan_from_json(j);
}

}  // namespace ferry::plan
