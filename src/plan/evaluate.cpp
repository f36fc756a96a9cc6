// SPDX-License-Identifier: Apache-2.0
// Window-by-window accounting of a plan (docs/plan.md, "accounting rules").
#include "plan/evaluate.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

namespace ferry::plan {

std::string_view to_string(Home h) {
  switch (h) {
    case Home::kGpu:
      return "gpu";
    case Home::kHost:
      return "host";
    case Home::kNvme:
      return "nvme";
    case Home::kRecompute:
      return "recompute";
  }
  return "?";
}

namespace {

bool offloaded(Home h) { return h == Home::kHost || h == Home::kNvme; }

// Successor of each materialized boundary along the path, -1 elsewhere; checks the path.
Result<std::vector<int>> path_successors(const PlanProblem& p, const Plan& plan) {
  const int L = p.num_layers;
  std::vector<int> next(L + 1, -1);
  int at = 0;
  for (const Span& s : plan.spans) {
    if (s.start != at) return invalid_argument("plan: span starts at {}, expected {}", s.start, at);
    if (s.end <= s.start || s.end > L) {
      return invalid_argument("plan: span [{}, {}] out of order", s.start, s.end);
    }
    if (s.end - s.start > p.max_span) {
      return invalid_argument("plan: span [{}, {}] longer than max span {}", s.start, s.end,
                              p.max_span);
    }
    if (s.keep_weights && s.end - s.start < 2) {
      return invalid_argument("plan: span [{}, {}] keeps weights but recomputes nothing", s.start,
                              s.end);
    }
    next[s.start] = s.end;
    at = s.end;
  }
  if (at != L) return invalid_argument("plan: spans end at boundary {}, not {}", at, L);
  return next;
}

}  // namespace

Result<Prediction> evaluate(const PlanProblem& p, const Plan& plan) {
  FERRY_TRY(validate(p));
  const int L = p.num_layers;
  const int T = p.num_windows();
  if (plan.num_layers != L || static_cast<int>(plan.homes.size()) != L + 1) {
    return invalid_argument("plan: plan has {} layers / {} homes, problem has {} layers",
                            plan.num_layers, plan.homes.size(), L);
  }
  FERRY_ASSIGN_OR_RETURN(std::vector<int> next, path_successors(p, plan));
  for (int i = 0; i <= L; ++i) {
    const bool materialized = next[i] >= 0 || i == L;
    if (materialized == (plan.homes[i] == Home::kRecompute)) {
      return invalid_argument("plan: boundary {} home {} disagrees with the spans", i,
                              to_string(plan.homes[i]));
    }
  }
  if (plan.homes[L] != Home::kGpu) {
    return invalid_argument("plan: boundary {} (the loss's input) must stay on the gpu", L);
  }
  if (!plan.keep_internals.empty() && static_cast<int>(plan.keep_internals.size()) != L) {
    return invalid_argument("plan: {} keep-internals flags for {} layers",
                            plan.keep_internals.size(), L);
  }
  for (int j = 0; j < L; ++j) {
    if (plan.keeps(j) && !keep_allowed(p, j)) {
      return invalid_argument(
          "plan: layer {} keeps its internals, which the problem does not allow (allow {}, saves "
          "{} ms)",
          j, p.allow_keep_internals, p.layers[j].keep_saved_ms);
    }
  }
  if (plan.resident_layers != resident_count(p)) {
    return invalid_argument("plan: plan has {} resident layers, problem {}", plan.resident_layers,
                            resident_count(p));
  }
  if (!p.has_nvme()) {
    for (Home h : plan.homes) {
      if (h == Home::kNvme) return invalid_argument("plan: nvme home but no nvme tier");
    }
  }

  const auto& A = p.boundary_gb;
  // Weights as streamed: a GPU-resident layer's (resident_layers) never cross the link.
  const auto W = [&](int j) { return streamed_weight_gb(p, j); };
  std::vector<double> compute(T, 0), h2d(T, 0), d2h(T, 0), nv_read(T, 0);
  std::vector<double> gpu(T, p.gpu_fixed_gb + resident_gpu_gb(p) + device_tail_gpu_gb(p));
  double recompute = 0, moved = 0;

  // Compute and working memory of each window.
  for (int j = 0; j < L; ++j) {
    compute[p.fwd_window(j)] = p.layers[j].fwd_ms;
    gpu[p.fwd_window(j)] += p.layers[j].work_fwd_gb;
    compute[p.bwd_window(j)] = p.layers[j].bwd_ms;
    gpu[p.bwd_window(j)] += p.layers[j].work_bwd_gb;
  }
  compute[L] = p.loss_ms;
  gpu[L] += p.loss_work_gb;

  // Kept internals: resident from the layer's forward through its backward, which then does not
  // re-run the layer's forward.
  double kept_gb = 0;
  for (int j = 0; j < L; ++j) {
    if (!plan.keeps(j)) continue;
    compute[p.bwd_window(j)] -= p.layers[j].keep_saved_ms;
    for (int t = p.fwd_window(j); t <= p.bwd_window(j); ++t) gpu[t] += p.layers[j].internals_gb;
    kept_gb += p.layers[j].internals_gb;
  }

  // Mandatory weight and gradient traffic: each window prefetches the next window's weights and
  // the backward windows drain the previous window's gradients.
  std::vector<bool> kept(L, false);  // layer's weights kept on the GPU since a recompute
  for (const Span& s : plan.spans) {
    if (s.keep_weights) {
      for (int k = s.start; k <= s.end - 2; ++k) kept[k] = true;
    }
  }
  for (int j = 0; j < L; ++j) {
    h2d[p.fwd_window(j)] += j + 1 < L ? W(j + 1) : p.head_weight_gb;
    if (j >= 1 && !kept[j - 1]) h2d[p.bwd_window(j)] += W(j - 1);
    d2h[p.bwd_window(j)] += j == L - 1 ? p.head_grad_gb : drained_grad_gb(p, j + 1);
  }
  h2d[L] += W(L - 1);
  // The device optimizer tail's H2D beside the forward's weight stream (device_tail_h2d_gb).
  const std::vector<double> tail_h2d = device_tail_h2d_gb(p);
  for (int t = 0; t < T; ++t) h2d[t] += tail_h2d[t];

  // Recompute spans: compute, weight traffic and memory inside the backward of layer end-1.
  for (const Span& s : plan.spans) {
    if (s.end - s.start < 2) continue;
    const int tb = p.bwd_window(s.end - 1);
    double wsum = 0;
    for (int k = s.start; k <= s.end - 2; ++k) {
      compute[tb] += p.layers[k].rec_ms;
      recompute += p.layers[k].rec_ms;
      wsum += W(k);
    }
    h2d[tb] += wsum;
    if (!s.keep_weights) moved += wsum;
    for (int j = s.start; j <= s.end - 1; ++j) {
      const int t = p.bwd_window(j);
      for (int k = s.start + 1; k <= j; ++k) gpu[t] += A[k];  // recomputed boundaries alive
      if (s.keep_weights) {
        for (int k = s.start; k <= std::min(j, s.end - 2); ++k) gpu[t] += W(k);
      }
    }
  }

  // Activation transfers: check windows and totals, add link/NVMe traffic.
  std::vector<double> out_gb(L + 1, 0), in_gb(L + 1, 0);
  std::vector<std::vector<double>> d2h_at(L + 1, std::vector<double>(T, 0));
  std::vector<std::vector<double>> h2d_at(L + 1, std::vector<double>(T, 0));
  for (const Transfer& x : plan.transfers) {
    const int i = x.boundary;
    if (i < 0 || i >= L || !offloaded(plan.homes[i])) {
      return invalid_argument("plan: transfer of boundary {}, which is not offloaded", i);
    }
    if (x.nvme != (plan.homes[i] == Home::kNvme) || !(x.gb >= 0) || !std::isfinite(x.gb)) {
      return invalid_argument("plan: transfer of boundary {} has the wrong tier or size", i);
    }
    const int lo = x.to_gpu ? first_h2d_window(p, i) : first_d2h_window(p, i);
    const int hi = x.to_gpu ? last_h2d_window(p, next[i])
                   : x.nvme ? last_nvme_d2h_window(p, i)
                            : last_d2h_window(p, i);
    if (x.window < lo || x.window > hi) {
      return invalid_argument("plan: {} of boundary {} in window {}, allowed {}..{}",
                              x.to_gpu ? "h2d" : "d2h", i, window_name(p, x.window),
                              window_name(p, lo), window_name(p, hi));
    }
    // The link: host homes both ways, NVMe fetches' H2D leg. An NVMe store's D2H leg runs inside
    // the store's serial time (below), not beside the window's compute.
    if (x.to_gpu) {
      h2d[x.window] += x.gb;
      if (x.nvme) nv_read[x.window] += x.gb;
    } else if (!x.nvme) {
      d2h[x.window] += x.gb;
    }
    (x.to_gpu ? in_gb : out_gb)[i] += x.gb;
    (x.to_gpu ? h2d_at : d2h_at)[i][x.window] += x.gb;
    moved += x.gb;
  }
  for (int i = 0; i < L; ++i) {
    const double want = offloaded(plan.homes[i]) ? A[i] : 0.0;
    const double tol = kGbTolerance * std::max(1.0, A[i]);
    if (std::abs(out_gb[i] - want) > tol || std::abs(in_gb[i] - want) > tol) {
      return invalid_argument("plan: boundary {} moves {} GB out and {} GB in, needs {} GB", i,
                              out_gb[i], in_gb[i], want);
    }
  }

  // Boundary residency on the GPU.
  gpu[L - 1] += A[L];  // boundary L: written in f_{L-1}, read by loss
  gpu[L] += A[L];
  for (int i = 0; i < L; ++i) {
    if (i >= 1) gpu[i - 1] += A[i];  // being written by layer i-1 (0: by the embedding) ...
    gpu[i] += A[i];                  // ... and read by layer i, whatever its home
    if (plan.homes[i] == Home::kGpu) {
      for (int t = i + 1; t <= p.bwd_window(i); ++t) gpu[t] += A[i];
    } else if (offloaded(plan.homes[i])) {
      double sent = 0;  // bytes that left before window t (those leaving in t still occupy it)
      for (int t = i + 1; t < L; ++t) {
        sent += d2h_at[i][t - 1];
        gpu[t] += std::max(0.0, A[i] - sent);
      }
      double arrived = 0;  // bytes that arrived up to and including window t
      for (int t = L; t <= p.bwd_window(i); ++t) {
        arrived += h2d_at[i][t];
        gpu[t] += arrived;
      }
    }
  }

  // NVMe stores through the bounce buffer (nvme_store_ms_per_gb): D2H then disk write, the host
  // waiting at the end of the window that produced the boundary; no compute hides them.
  std::vector<double> store(T, 0);
  for (int i = 0; i < L; ++i) {
    if (plan.homes[i] == Home::kNvme) {
      store[nvme_store_window(p, i)] += nvme_store_ms_per_gb(p) * A[i];
    }
  }

  Prediction r;
  r.window_compute_ms = compute;
  r.window_exposed_ms.assign(T, 0);
  r.window_gpu_gb = gpu;
  for (int t = 0; t < T; ++t) {
    // The CPU optimizer runs from the loss window on and slows the duplex link (measured: 101 vs
    // 83 GB/s with 14 threads streaming host memory, docs/plan.md).
    const double duplex = t >= L ? p.link.duplex_loaded_gbps : p.link.duplex_gbps;
    double need_ms =
        std::max({h2d[t] / p.link.h2d_gbps, d2h[t] / p.link.d2h_gbps, (h2d[t] + d2h[t]) / duplex}) *
        1e3;
    // NVMe fetches through the bounce buffer: read then H2D, one boundary at a time.
    const double fetch_ms = nvme_fetch_ms_per_gb(p) * nv_read[t];
    need_ms = std::max(need_ms, fetch_ms);
    r.nvme_fetch_ms += fetch_ms;
    r.nvme_store_ms += store[t];
    // The window lasts max(compute + stores, what its transfers need): the weight stream goes on
    // during a store, the compute does not.
    r.window_exposed_ms[t] = std::max({0.0, need_ms - compute[t], store[t]});
    r.compute_ms += compute[t];
    r.exposed_ms += r.window_exposed_ms[t];
    if (gpu[t] > r.gpu_peak_gb) {
      r.gpu_peak_gb = gpu[t];
      r.gpu_peak_window = t;
    }
  }
  r.recompute_ms = recompute;
  r.moved_gb = moved;
  r.resident_serial_ms = resident_serial_ms(p);
  r.resident_gb = resident_gpu_gb(p);
  r.device_tail_serial_ms = device_tail_serial_ms(p);
  r.gpu_step_ms = r.compute_ms + r.exposed_ms + p.step_fixed_ms + r.resident_serial_ms +
                  r.device_tail_serial_ms;
  // The forward pipeline behind the optimizer (optimizer_ready_ms): forward window j starts once
  // window j-1 has ended (compute and its transfers) and layer j's update is done.
  const std::vector<double> ready = optimizer_ready_ms(p);
  r.window_optimizer_wait_ms.assign(T, 0);
  double fwd_end = 0;
  for (int j = 0; j < L; ++j) {
    const int t = p.fwd_window(j);
    const double held = std::max(0.0, ready[j] - fwd_end);
    r.window_optimizer_wait_ms[t] = held;
    r.optimizer_wait_ms += held;
    fwd_end += held + compute[t] + r.window_exposed_ms[t];
  }
  const double with_optimizer =
      std::max(r.gpu_step_ms + r.optimizer_wait_ms, optimizer_phase_ms(p));
  r.optimizer_bound_ms = with_optimizer - r.gpu_step_ms - r.optimizer_wait_ms;
  // The host-home term: serial, per GB homed off the GPU (NVMe bytes pass through host memory).
  double homed_gb = 0;
  for (int i = 0; i < L; ++i) {
    if (offloaded(plan.homes[i])) homed_gb += A[i];
  }
  r.host_home_ms = p.host_home_ms_per_gb * homed_gb;
  r.resident_saved_ms = resident_saved_total_ms(p);
  r.step_ms = with_optimizer + r.host_home_ms - r.resident_saved_ms;
  r.kept_internals_gb = kept_gb;
  r.objective_ms = r.step_ms + p.move_penalty_ms_per_gb * (moved + kept_gb);
  r.host_peak_gb = p.host_fixed_gb;
  bool on_nvme = false;
  for (int i = 0; i < L; ++i) {
    if (plan.homes[i] == Home::kHost) r.host_peak_gb += A[i];
    if (plan.homes[i] == Home::kNvme) r.nvme_peak_gb += A[i];
    on_nvme = on_nvme || plan.homes[i] == Home::kNvme;
  }
  // NVMe traffic bounces through one pinned staging buffer the executor holds for the whole run
  // once any boundary lives on NVMe (nvme_bounce_gb): host memory in every window.
  r.nvme_bounce_gb = on_nvme ? nvme_bounce_gb(p) : 0.0;
  r.host_peak_gb += r.nvme_bounce_gb;
  r.tflops = r.step_ms > 0 ? p.model_flops_per_step / (r.step_ms * 1e-3) / 1e12 : 0;
  return r;
}

Status check_fits(const PlanProblem& p, const Prediction& pred) {
  if (pred.gpu_peak_gb > p.gpu_cap_gb + kGbTolerance) {
    return resource_exhausted("plan: gpu memory: needs {:.3f} GB at {}, capacity {:.3f} GB",
                              pred.gpu_peak_gb, window_description(p, pred.gpu_peak_window),
                              p.gpu_cap_gb);
  }
  if (pred.host_peak_gb > p.host_cap_gb + kGbTolerance) {
    const std::string bounce =
        pred.nvme_bounce_gb > 0
            ? fmt::format(" (incl. the {:.3f} GB nvme bounce buffer)", pred.nvme_bounce_gb)
            : std::string();
    return resource_exhausted("plan: host memory: needs {:.3f} GB{}, capacity {:.3f} GB",
                              pred.host_peak_gb, bounce, p.host_cap_gb);
  }
  if (pred.nvme_peak_gb > p.nvme_cap_gb + kGbTolerance) {
    return resource_exhausted("plan: nvme: needs {:.3f} GB, capacity {:.3f} GB", pred.nvme_peak_gb,
                              p.nvme_cap_gb);
  }
  return ok_status();
}

}  // namespace ferry::plan
