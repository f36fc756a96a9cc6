// SPDX-License-Identifier: Apache-2.0
#include "plan/report.h"

#include <fmt/format.h>

namespace ferry::plan {

namespace {

// "kept internals: 2 of 24 layers (3, 7), 1.234 GB on the gpu, 12.3 ms of re-forward saved".
std::string kept_internals_text(const PlanProblem& p, const Plan& plan) {
  if (plan.num_kept() == 0) {
    return fmt::format("kept internals: none ({})\n",
                       p.allow_keep_internals ? "every backward re-runs its layer's forward"
                                              : "not allowed in this problem");
  }
  std::string layers;
  double saved_ms = 0;
  for (int j = 0; j < p.num_layers; ++j) {
    if (!plan.keeps(j)) continue;
    layers += fmt::format("{}{}", layers.empty() ? "" : ", ", j);
    saved_ms += p.layers[j].keep_saved_ms;
  }
  return fmt::format(
      "kept internals: {} of {} layers ({}), {:.3f} GB on the gpu, {:.1f} ms of re-forward "
      "saved\n",
      plan.num_kept(), p.num_layers, layers, plan.predicted.kept_internals_gb, saved_ms);
}

}  // namespace

std::string plan_text(const PlanProblem& p, const Plan& plan) {
  const Prediction& r = plan.predicted;
  std::string s;
  s += fmt::format("plan {}: {} layers, batch {} x seq {}, costs {} (predictions, not measured)\n",
                   plan.policy, p.num_layers, p.batch_size, p.seq_len, p.source);
  s += fmt::format("solver {}: {} in {:.2f} s, objective {:.3f} ms, bound {:.3f} ms, gap {:.3f}%\n",
                   plan.solver.solver, plan.solver.status, plan.solver.seconds,
                   plan.solver.objective_ms, plan.solver.bound_ms, 100 * plan.solver.gap);
  // keep: "yes" when layer i (the layer boundary i feeds) keeps its internals until its backward.
  s += "\nboundary  home       GB      keep  span\n";
  std::vector<const Span*> span_from(p.num_layers + 1, nullptr);
  for (const Span& sp : plan.spans) span_from[sp.start] = &sp;
  for (int i = 0; i <= p.num_layers; ++i) {
    std::string span;
    if (const Span* sp = span_from[i]; sp != nullptr && sp->end - sp->start >= 2) {
      span = fmt::format("-> {} (recompute layers {}..{}, {} weights)", sp->end, sp->start,
                         sp->end - 2, sp->keep_weights ? "keep" : "re-stream");
    }
    const std::string_view keep = i == p.num_layers ? "" : plan.keeps(i) ? "yes" : "-";
    s += fmt::format("{:<9} {:<10} {:<7.3f} {:<5} {}\n", i, to_string(plan.homes[i]),
                     p.boundary_gb[i], keep, span);
  }
  s += "\nwindow  compute_ms  exposed_ms  opt_wait_ms  gpu_gb\n";
  for (int t = 0; t < p.num_windows(); ++t) {
    const double held =
        t < static_cast<int>(r.window_optimizer_wait_ms.size()) ? r.window_optimizer_wait_ms[t] : 0;
    s += fmt::format("{:<7} {:>10.3f}  {:>10.3f}  {:>11.3f}  {:>6.2f}\n", window_name(p, t),
                     r.window_compute_ms[t], r.window_exposed_ms[t], held, r.window_gpu_gb[t]);
  }
  s += fmt::format(
      "\npredicted step {:.1f} ms = gpu {:.1f} (compute {:.1f} incl. recompute {:.1f}, exposed "
      "{:.2f}, serial {:.1f}) + optimizer wait {:.1f} (forward held by the cpu optimizer) + "
      "optimizer bound {:.1f} (cpu optimizer {:.1f} ms/step outlasting the gpu) + host homes "
      "{:.1f} - resident saving {:.1f}; {:.1f} TFLOPS (6*N*B*S / step)\n",
      r.step_ms, r.gpu_step_ms, r.compute_ms, r.recompute_ms, r.exposed_ms, p.step_fixed_ms,
      r.optimizer_wait_ms, r.optimizer_bound_ms, optimizer_phase_ms(p), r.host_home_ms,
      r.resident_saved_ms, r.tflops);
  if (p.host_home_ms_per_gb > 0) {
    s += fmt::format(
        "host homes: {:.2f} ms per GB homed in host memory or on NVMe (measured; NVMe bytes pass "
        "through host memory), serial, even when the transfers hide\n",
        p.host_home_ms_per_gb);
  } else {
    s += "host homes: no measured cost (0 ms/GB: a profile without host_home_ms_per_gb, or the "
         "analytic model); off-gpu boundaries are free when their transfers hide\n";
  }
  if (r.nvme_bounce_gb > 0) {
    s += fmt::format(
        "nvme traffic through the one bounce buffer: stores {:.1f} ms (d2h then disk write, "
        "{:.2f} ms/GB, serial: the host waits, no compute hides them), fetches {:.1f} ms (disk "
        "read then h2d, {:.2f} ms/GB, one boundary at a time, hidden by their windows' compute "
        "where it can)\n",
        r.nvme_store_ms, nvme_store_ms_per_gb(p), r.nvme_fetch_ms, nvme_fetch_ms_per_gb(p));
  }
  if (device_tail_layers(p) > 0) {
    double tail_gb = 0;
    for (double gb : device_tail_h2d_gb(p)) tail_gb += gb;
    s += fmt::format(
        "device optimizer tail on the link: {:.3f} GB of its H2D in the forward windows beside the "
        "weight stream; its layer-0 update before the forward {:+.1f} ms serial vs the cpu's\n",
        tail_gb, r.device_tail_serial_ms);
  }
  if (p.resident_saved_ms > 0) {
    s += fmt::format(
        "resident saving: {:.2f} ms per GPU-resident layer beyond the model (measured): {} of {} "
        "resident\n",
        p.resident_saved_ms, resident_count(p), p.num_layers);
  }
  // Host memory is the same in every window (the executor allocates the host homes and the NVMe
  // bounce buffer for the whole run), so its peak is every window's.
  const std::string host_note =
      r.nvme_bounce_gb > 0
          ? fmt::format("every window, incl. the {:.2f} GB nvme bounce buffer", r.nvme_bounce_gb)
          : std::string("every window");
  s += fmt::format(
      "peak memory: gpu {:.2f} / {:.2f} GB ({}), host {:.2f} / {:.2f} GB ({}), nvme {:.2f} "
      "/ {:.2f} GB\n",
      r.gpu_peak_gb, p.gpu_cap_gb, window_description(p, r.gpu_peak_window), r.host_peak_gb,
      p.host_cap_gb, host_note, r.nvme_peak_gb, p.nvme_cap_gb);
  s += kept_internals_text(p, plan);
  if (r.optimizer_bound_ms > 0 || r.optimizer_wait_ms > 0.02 * r.step_ms) {
    s += "note: the CPU optimizer holds the GPU back; a larger batch amortizes it\n";
  }
  return s;
}

std::string comparison_text(const Comparison& c) {
  std::string s = fmt::format(
      "\npolicy               at batch {:<4}                               | largest batch"
      "                | solved plan there\n"
      "                       step_ms    TFLOPS  exposed_ms opt_wait_ms |  batch  step_ms    "
      "TFLOPS "
      "|  step_ms    TFLOPS\n",
      c.batch);
  for (const PolicyRow& r : c.rows) {
    std::string a = "does not fit";
    if (r.at_batch) {
      const Prediction& q = r.at_batch->predicted;
      a = fmt::format("{:>9.1f} {:>9.1f} {:>11.2f} {:>11.2f}", q.step_ms, q.tflops, q.exposed_ms,
                      q.optimizer_wait_ms);
    }
    std::string b = "      -";
    if (r.at_largest) {
      b = fmt::format("{:>6} {:>9.1f} {:>9.1f}", r.largest_batch, r.at_largest->predicted.step_ms,
                      r.at_largest->predicted.tflops);
    }
    std::string same;
    if (r.solved_at_largest) {
      same = fmt::format(" | {:>8.1f} {:>9.1f}", r.solved_at_largest->predicted.step_ms,
                         r.solved_at_largest->predicted.tflops);
    }
    s += fmt::format("{:<20} {:<43} | {:<24}{}\n", r.policy, a, b, same);
  }
  return s;
}

}  // namespace ferry::plan
