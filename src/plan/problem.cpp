// SPDX-License-Identifier: Apache-2.0
#include "plan/problem.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace ferry::plan {

std::string window_name(const PlanProblem& p, int t) {
  if (t < p.num_layers) return fmt::format("f{}", t);
  if (t == p.num_layers) return "loss";
  return fmt::format("b{}", 2 * p.num_layers - t);
}

std::string window_description(const PlanProblem& p, int t) {
  if (t < p.num_layers) return fmt::format("forward of layer {}", t);
  if (t == p.num_layers) return "the loss window";
  return fmt::format("backward of layer {}", 2 * p.num_layers - t);
}

namespace {

// The device tail's optimizer phase from its start (t = 0): when each layer's update is done and
// when the later side finishes.
struct TailPhase {
  std::vector<double> done_ms;  // [L]
  std::vector<bool> on_device;  // [L] the layers the device claimed
  double end_ms = 0;
};

// Layer j's CPU update: measured (every layer has optimizer_ms) or its share by weight of
// cpu_optimizer_ms (total_w: the layers' weight; 0 without weight).
double cpu_layer_ms(const PlanProblem& p, int j, bool measured, double total_w) {
  if (measured) return p.layers[j].optimizer_ms;
  return total_w > 0 ? p.cpu_optimizer_ms * p.layers[j].weight_gb / total_w : 0.0;
}

TailPhase simulate_device_tail(const PlanProblem& p, bool measured, double total_w) {
  const int L = p.num_layers;
  std::vector<double> cpu_ms(L);
  double layers_ms = 0;
  for (int j = 0; j < L; ++j) {
    cpu_ms[j] = cpu_layer_ms(p, j, measured, total_w);
    layers_ms += cpu_ms[j];
  }
  // (The globals are what the measured total has beyond every layer's time, resident or not.)
  // Measured per-layer times: the rest of the CPU optimizer's time is the globals' (run first).
  const double globals_ms = measured ? std::max(0.0, p.cpu_optimizer_ms - layers_ms) : 0.0;
  // The tail works on the non-resident layers only (resident ones are updated in place).
  const int first = resident_count(p);
  const int k_max = std::min(p.device_update_layers, L - first) + first;
  TailPhase t;
  t.done_ms.assign(L, 0.0);
  t.on_device.assign(L, false);
  int low = first;   // the device's next layer
  int high = L - 1;  // the CPU's next layer
  double dev_free = 0;
  double cpu_free = globals_ms;
  while (low <= high) {
    // Whoever is free first claims (ties: the device); the device stops after k_max layers.
    if (low < k_max && dev_free <= cpu_free) {
      dev_free += device_update_layer_ms(p, low);
      t.on_device[low] = true;
      t.done_ms[low++] = dev_free;
    } else {
      cpu_free += cpu_ms[high];
      t.done_ms[high--] = cpu_free;
    }
  }
  t.end_ms = std::max(dev_free, cpu_free);
  return t;
}

bool measured_layers(const PlanProblem& p) {
  return std::all_of(p.layers.begin(), p.layers.end(),
                     [](const LayerCost& c) { return c.optimizer_ms > 0; });
}

double total_weight_gb(const PlanProblem& p) {
  double total_w = 0;
  for (const LayerCost& c : p.layers) total_w += c.weight_gb;
  return total_w;
}

// Layer 0's CPU update, which step_fixed_ms holds (cost_model.cpp, bench_profile.cpp): measured,
// or its share by weight of cpu_optimizer_ms; 0 without an optimizer time.
double layer0_cpu_ms(const PlanProblem& p) {
  const bool measured = measured_layers(p);
  if (!measured && !(p.cpu_optimizer_ms > 0)) return 0;
  return cpu_layer_ms(p, 0, measured, total_weight_gb(p));
}

}  // namespace

std::vector<double> optimizer_ready_ms(const PlanProblem& p) {
  const int L = p.num_layers;
  std::vector<double> ready(L, 0.0);
  const double total_w = total_weight_gb(p);
  const bool measured = measured_layers(p);
  if (!measured && (!(p.cpu_optimizer_ms > 0) || !(total_w > 0))) return ready;
  const int K = resident_count(p);
  if (K > 0) {
    // Resident layers: the GPU updates 0..K-1 in place from the clip point (time 0), then the
    // forward of layer 0 starts (at S); the CPU (or the tail with it) updates K..L-1 from time 0.
    // Layer j's forward waits until max(0, its update's end - S).
    double S = 0;
    for (int j = 0; j < K; ++j) S += resident_update_layer_ms(p, j);
    if (p.device_update_layers <= 0) {
      double done = 0;
      for (int j = K; j < L; ++j) {
        done += cpu_layer_ms(p, j, measured, total_w);
        ready[j] = std::max(0.0, done - S);
      }
      return ready;
    }
    const TailPhase tail = simulate_device_tail(p, measured, total_w);
    for (int j = K; j < L; ++j) ready[j] = std::max(0.0, tail.done_ms[j] - S);
    return ready;
  }
  if (p.device_update_layers <= 0) {
    double done = 0;  // updates finished after layer 0's, in ms
    for (int j = 1; j < L; ++j) {
      done += cpu_layer_ms(p, j, measured, total_w);
      ready[j] = done;
    }
    return ready;
  }
  const TailPhase tail = simulate_device_tail(p, measured, total_w);
  for (int j = 1; j < L; ++j) ready[j] = std::max(0.0, tail.done_ms[j] - tail.done_ms[0]);
  return ready;
}

double optimizer_phase_ms(const PlanProblem& p) {
  const int K = resident_count(p);
  if (p.device_update_layers <= 0 && K == 0) return p.cpu_optimizer_ms;
  const double total_w = total_weight_gb(p);
  const bool measured = measured_layers(p);
  if (!measured && (!(p.cpu_optimizer_ms > 0) || !(total_w > 0))) return p.cpu_optimizer_ms;
  if (p.device_update_layers <= 0) {
    // The CPU does everything but the resident layers' share.
    double resident_ms = 0;
    for (int j = 0; j < K; ++j) resident_ms += cpu_layer_ms(p, j, measured, total_w);
    return std::max(0.0, p.cpu_optimizer_ms - resident_ms);
  }
  return simulate_device_tail(p, measured, total_w).end_ms;
}

int resident_count(const PlanProblem& p) { return std::clamp(p.resident_layers, 0, p.num_layers); }

double streamed_weight_gb(const PlanProblem& p, int j) {
  return j < resident_count(p) ? 0.0 : p.layers[j].weight_gb;
}

double drained_grad_gb(const PlanProblem& p, int j) {
  return j < resident_count(p) ? 0.0 : p.layers[j].grad_gb;
}

double resident_gpu_gb(const PlanProblem& p) {
  double gb = 0;
  for (int j = 0; j < resident_count(p); ++j) gb += p.layers[j].resident_gb;
  return gb;
}

double resident_update_layer_ms(const PlanProblem& p, int j) {
  if (p.resident_update_ms_per_layer > 0) return p.resident_update_ms_per_layer;
  return kResidentUpdateMsPerGb * p.layers[j].resident_gb;
}

double resident_saved_total_ms(const PlanProblem& p) {
  return p.resident_saved_ms * resident_count(p);
}

double resident_serial_ms(const PlanProblem& p) {
  const int K = resident_count(p);
  if (K == 0) return 0;
  double gpu_ms = 0;
  for (int j = 0; j < K; ++j) gpu_ms += resident_update_layer_ms(p, j);
  // Layer 0's CPU share, which step_fixed_ms holds.
  return gpu_ms - std::min(layer0_cpu_ms(p), p.step_fixed_ms);
}

double device_tail_layer_h2d_gb(const PlanProblem& p, int j) {
  if (p.device_update_h2d_gb_per_layer > 0) return p.device_update_h2d_gb_per_layer;
  // ASSUMED: the bytes the tail moves up per layer (its optimizer sections + gradients) are the
  // layer's share by weight of the host-resident model state (host_fixed_gb, spread over the
  // layers and the head; the embedding's share, when counted there, is smeared over them too).
  const double total_w = p.head_weight_gb + total_weight_gb(p);
  if (!(total_w > 0)) return 0;
  return p.host_fixed_gb * p.layers[j].weight_gb / total_w;
}

double device_update_layer_ms(const PlanProblem& p, int j) {
  if (p.device_update_ms_per_layer > 0) return p.device_update_ms_per_layer;
  // ASSUMED: the tail's bytes at the H2D rate alone (the tail is H2D-bound:
  // docs/train_gpu_executor.md item 5); the kernels, the D2H of the results and the first unit's
  // latency are not counted.
  if (!(p.link.h2d_gbps > 0)) return 0;
  return device_tail_layer_h2d_gb(p, j) / p.link.h2d_gbps * 1e3;
}

std::vector<double> device_tail_h2d_gb(const PlanProblem& p) {
  std::vector<double> gb(p.num_windows(), 0.0);
  if (device_tail_layers(p) <= 0) return gb;
  const TailPhase tail = simulate_device_tail(p, measured_layers(p), total_weight_gb(p));
  for (int j = 1; j < p.num_layers; ++j) {
    if (tail.on_device[j]) gb[p.fwd_window(j - 1)] += device_tail_layer_h2d_gb(p, j);
  }
  return gb;
}

double device_tail_serial_ms(const PlanProblem& p) {
  // The device claims its lowest layer first, at the clip point (ties go to the device), so with
  // no resident layers layer 0 is always the device's.
  if (device_tail_layers(p) <= 0 || resident_count(p) > 0) return 0;
  return device_update_layer_ms(p, 0) - std::min(layer0_cpu_ms(p), p.step_fixed_ms);
}

int device_tail_layers(const PlanProblem& p) {
  return std::clamp(p.device_update_layers, 0, p.num_layers - resident_count(p));
}

double device_tail_gpu_gb(const PlanProblem& p) {
  return device_tail_layers(p) > 0 ? p.device_update_staging_gb : 0.0;
}

double nvme_bounce_gb(const PlanProblem& p) {
  if (!p.has_nvme()) return 0;
  double gb = 0;
  for (int i = 0; i < p.num_layers; ++i) gb = std::max(gb, p.boundary_gb[i]);
  return gb;
}

double nvme_store_ms_per_gb(const PlanProblem& p) {
  if (!p.has_nvme()) return 0;
  return 1e3 * (1.0 / p.link.d2h_gbps + 1.0 / p.link.nvme_write_gbps);
}

double nvme_fetch_ms_per_gb(const PlanProblem& p) {
  if (!p.has_nvme()) return 0;
  return 1e3 * (1.0 / p.link.nvme_read_gbps + 1.0 / p.link.h2d_gbps);
}

namespace {

bool finite_nonneg(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

Status validate(const PlanProblem& p) {
  const int L = p.num_layers;
  if (L < 1) return invalid_argument("plan: problem has {} layers, need >= 1", L);
  if (static_cast<int>(p.boundary_gb.size()) != L + 1) {
    return invalid_argument("plan: {} boundary sizes for {} layers, need L+1", p.boundary_gb.size(),
                            L);
  }
  if (static_cast<int>(p.layers.size()) != L) {
    return invalid_argument("plan: {} layer costs for {} layers", p.layers.size(), L);
  }
  for (int i = 0; i <= L; ++i) {
    if (!finite_nonneg(p.boundary_gb[i])) return invalid_argument("plan: boundary {} bytes < 0", i);
  }
  for (int j = 0; j < L; ++j) {
    const LayerCost& c = p.layers[j];
    for (double v : {c.fwd_ms, c.bwd_ms, c.rec_ms, c.weight_gb, c.grad_gb, c.work_fwd_gb,
                     c.work_bwd_gb, c.internals_gb, c.keep_saved_ms, c.resident_gb}) {
      if (!finite_nonneg(v)) return invalid_argument("plan: layer {} has a negative cost", j);
    }
    if (c.keep_saved_ms > c.bwd_ms) {
      return invalid_argument("plan: layer {} saves {} ms of a {} ms backward by keeping internals",
                              j, c.keep_saved_ms, c.bwd_ms);
    }
  }
  for (double v :
       {p.loss_ms, p.loss_work_gb, p.head_weight_gb, p.head_grad_gb, p.step_fixed_ms,
        p.cpu_optimizer_ms, p.gpu_cap_gb, p.host_cap_gb, p.nvme_cap_gb, p.gpu_fixed_gb,
        p.host_fixed_gb, p.move_penalty_ms_per_gb, p.host_home_ms_per_gb, p.resident_saved_ms}) {
    if (!finite_nonneg(v)) return invalid_argument("plan: a step cost or capacity is negative");
  }
  const LinkRates& r = p.link;
  if (!(r.h2d_gbps > 0 && r.d2h_gbps > 0 && r.duplex_gbps > 0 && r.duplex_loaded_gbps > 0)) {
    return invalid_argument("plan: link rates must be > 0 (h2d {}, d2h {}, duplex {}, loaded {})",
                            r.h2d_gbps, r.d2h_gbps, r.duplex_gbps, r.duplex_loaded_gbps);
  }
  if (p.nvme_cap_gb > 0 && !(r.nvme_read_gbps > 0 && r.nvme_write_gbps > 0)) {
    return invalid_argument("plan: an NVMe tier needs read and write rates > 0");
  }
  if (p.max_span < 1) return invalid_argument("plan: max span {} < 1", p.max_span);
  if (p.device_update_layers < 0) {
    return invalid_argument("plan: device_update_layers {} < 0", p.device_update_layers);
  }
  if (p.resident_layers < 0) {
    return invalid_argument("plan: resident_layers {} < 0", p.resident_layers);
  }
  if (!finite_nonneg(p.resident_update_ms_per_layer)) {
    return invalid_argument("plan: resident_update_ms_per_layer {} is not a time",
                            p.resident_update_ms_per_layer);
  }
  if (!finite_nonneg(p.device_update_ms_per_layer)) {
    return invalid_argument("plan: device_update_ms_per_layer {} is not a time",
                            p.device_update_ms_per_layer);
  }
  if (!finite_nonneg(p.device_update_h2d_gb_per_layer)) {
    return invalid_argument("plan: device_update_h2d_gb_per_layer {} is not a size",
                            p.device_update_h2d_gb_per_layer);
  }
  if (!finite_nonneg(p.device_update_staging_gb)) {
    return invalid_argument("plan: device_update_staging_gb {} is not a size",
                            p.device_update_staging_gb);
  }
  return ok_status();
}

Json to_json(const LinkRates& r) {
  return {{"h2d_gbps", r.h2d_gbps},
          {"d2h_gbps", r.d2h_gbps},
          {"duplex_gbps", r.duplex_gbps},
          {"duplex_loaded_gbps", r.duplex_loaded_gbps},
          {"nvme_read_gbps", r.nvme_read_gbps},
          {"nvme_write_gbps", r.nvme_write_gbps}};
}

void set_symmetric_link(LinkRates& r, double gbps) {
  r.h2d_gbps = r.d2h_gbps = gbps;
  r.duplex_gbps = 1.8 * gbps;
  r.duplex_loaded_gbps = 1.5 * gbps;
}

Json to_json(const PlanProblem& p) {
  Json layers = Json::array();
  for (const LayerCost& c : p.layers) {
    layers.push_back({{"fwd_ms", c.fwd_ms},
                      {"bwd_ms", c.bwd_ms},
                      {"rec_ms", c.rec_ms},
                      {"weight_gb", c.weight_gb},
                      {"grad_gb", c.grad_gb},
                      {"work_fwd_gb", c.work_fwd_gb},
                      {"work_bwd_gb", c.work_bwd_gb},
                      {"optimizer_ms", c.optimizer_ms},
                      {"internals_gb", c.internals_gb},
                      {"keep_saved_ms", c.keep_saved_ms}});
    if (c.resident_gb != 0) layers.back()["resident_gb"] = c.resident_gb;
  }
  Json j = {{"num_layers", p.num_layers},
            {"boundary_gb", p.boundary_gb},
            {"layers", layers},
            {"loss_ms", p.loss_ms},
            {"loss_work_gb", p.loss_work_gb},
            {"head_weight_gb", p.head_weight_gb},
            {"head_grad_gb", p.head_grad_gb},
            {"step_fixed_ms", p.step_fixed_ms},
            {"cpu_optimizer_ms", p.cpu_optimizer_ms},
            {"link", to_json(p.link)},
            {"gpu_cap_gb", p.gpu_cap_gb},
            {"host_cap_gb", p.host_cap_gb},
            {"nvme_cap_gb", p.nvme_cap_gb},
            {"gpu_fixed_gb", p.gpu_fixed_gb},
            {"host_fixed_gb", p.host_fixed_gb},
            {"max_span", p.max_span},
            {"allow_keep_internals", p.allow_keep_internals},
            {"move_penalty_ms_per_gb", p.move_penalty_ms_per_gb},
            {"batch_size", p.batch_size},
            {"seq_len", p.seq_len},
            {"model_flops_per_step", p.model_flops_per_step},
            {"source", p.source}};
  // Only with the device tail on, so that problems without it serialize as before.
  if (p.device_update_layers != 0 || p.device_update_ms_per_layer != 0) {
    j["device_update_layers"] = p.device_update_layers;
    j["device_update_ms_per_layer"] = p.device_update_ms_per_layer;
  }
  if (p.device_update_h2d_gb_per_layer != 0) {
    j["device_update_h2d_gb_per_layer"] = p.device_update_h2d_gb_per_layer;
  }
  if (p.device_update_staging_gb != 0) j["device_update_staging_gb"] = p.device_update_staging_gb;
  // Only when measured, likewise (a problem without the term serializes as before).
  if (p.host_home_ms_per_gb != 0) j["host_home_ms_per_gb"] = p.host_home_ms_per_gb;
  if (p.resident_saved_ms != 0) j["resident_saved_ms"] = p.resident_saved_ms;
  // Only with resident layers (or a measured update time), likewise.
  if (p.resident_layers != 0) j["resident_layers"] = p.resident_layers;
  if (p.resident_update_ms_per_layer != 0) {
    j["resident_update_ms_per_layer"] = p.resident_update_ms_per_layer;
  }
  return j;
}

Result<PlanProblem> problem_from_json(const Json& j) {
  // nlohmann throws on a missing key or a wrong type; src/ lets no exception escape.
  try {
    PlanProblem p;
    p.num_layers = j.at("num_layers").get<int>();
    p.boundary_gb = j.at("boundary_gb").get<std::vector<double>>();
    for (const Json& c : j.at("layers")) {
      LayerCost l;
      l.fwd_ms = c.at("fwd_ms").get<double>();
      l.bwd_ms = c.at("bwd_ms").get<double>();
      l.rec_ms = c.at("rec_ms").get<double>();
      l.weight_gb = c.at("weight_gb").get<double>();
      l.grad_gb = c.at("grad_gb").get<double>();
      l.work_fwd_gb = c.at("work_fwd_gb").get<double>();
      l.work_bwd_gb = c.at("work_bwd_gb").get<double>();
      l.optimizer_ms = c.value("optimizer_ms", 0.0);  // absent before per-layer times
      l.internals_gb = c.value("internals_gb", 0.0);  // absent before the keep choice
      l.keep_saved_ms = c.value("keep_saved_ms", 0.0);
      l.resident_gb = c.value("resident_gb", 0.0);  // absent before resident layers
      p.layers.push_back(l);
    }
    p.loss_ms = j.at("loss_ms").get<double>();
    p.loss_work_gb = j.at("loss_work_gb").get<double>();
    p.head_weight_gb = j.at("head_weight_gb").get<double>();
    p.head_grad_gb = j.at("head_grad_gb").get<double>();
    p.step_fixed_ms = j.at("step_fixed_ms").get<double>();
    p.cpu_optimizer_ms = j.at("cpu_optimizer_ms").get<double>();
    const Json& r = j.at("link");
    p.link.h2d_gbps = r.at("h2d_gbps").get<double>();
    p.link.d2h_gbps = r.at("d2h_gbps").get<double>();
    p.link.duplex_gbps = r.at("duplex_gbps").get<double>();
    p.link.duplex_loaded_gbps = r.at("duplex_loaded_gbps").get<double>();
    p.link.nvme_read_gbps = r.at("nvme_read_gbps").get<double>();
    p.link.nvme_write_gbps = r.at("nvme_write_gbps").get<double>();
    p.gpu_cap_gb = j.at("gpu_cap_gb").get<double>();
    p.host_cap_gb = j.at("host_cap_gb").get<double>();
    p.nvme_cap_gb = j.at("nvme_cap_gb").get<double>();
    p.gpu_fixed_gb = j.at("gpu_fixed_gb").get<double>();
    p.host_fixed_gb = j.at("host_fixed_gb").get<double>();
    p.max_span = j.at("max_span").get<int>();
    // Absent before the keep choice existed: such a document keeps nothing (its old plans).
    p.allow_keep_internals = j.value("allow_keep_internals", false);
    p.device_update_layers = j.value("device_update_layers", 0);  // absent before the tail
    p.device_update_ms_per_layer = j.value("device_update_ms_per_layer", 0.0);
    // Absent: derived from host_fixed_gb (documents before the tail's bytes were carried).
    p.device_update_h2d_gb_per_layer = j.value("device_update_h2d_gb_per_layer", 0.0);
    // Absent: the staging, if any, is in gpu_fixed_gb (documents before the tail search).
    p.device_update_staging_gb = j.value("device_update_staging_gb", 0.0);
    p.host_home_ms_per_gb = j.value("host_home_ms_per_gb", 0.0);  // absent: not measured
    p.resident_saved_ms = j.value("resident_saved_ms", 0.0);      // absent: not measured
    p.resident_layers = j.value("resident_layers", 0);  // absent before resident layers: none
    p.resident_update_ms_per_layer = j.value("resident_update_ms_per_layer", 0.0);
    p.move_penalty_ms_per_gb = j.at("move_penalty_ms_per_gb").get<double>();
    p.batch_size = j.at("batch_size").get<int>();
    p.seq_len = j.at("seq_len").get<int>();
    p.model_flops_per_step = j.at("model_flops_per_step").get<double>();
    p.source = j.at("source").get<std::string>();
    FERRY_TRY(validate(p));
    return p;
  } catch (const Json::exception& e) {
    return corrupt("plan: problem json: {}", e.what());
  }
}

}  // namespace ferry::plan
