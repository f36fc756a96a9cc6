// SPDX-License-Identifier: Apache-2.0
// The MILP rows, one block per rule of docs/plan.md. Written independently of evaluate.cpp (which
// walks a concrete plan); tests hold the two to the same numbers.
#include "plan/schedule_model.h"

#include <algorithm>
#include <map>

#include "core/check.h"
#include "plan/evaluate.h"

namespace ferry::plan {

std::string_view to_string(Tier t) {
  switch (t) {
    case Tier::kGpu:
      return "gpu memory";
    case Tier::kHost:
      return "host memory";
    case Tier::kNvme:
      return "nvme";
  }
  return "?";
}

int LinearModel::add_col(double lb, double ub, double cost, bool is_integer) {
  col_lb.push_back(lb);
  col_ub.push_back(ub);
  obj.push_back(cost);
  integer.push_back(is_integer ? 1 : 0);
  return num_cols() - 1;
}

void LinearModel::add_row(std::vector<std::pair<int, double>> terms, double lb, double ub) {
  std::map<int, double> merged;
  for (const auto& [col, v] : terms) {
    FERRY_CHECK(col >= 0 && col < num_cols(), "plan: row term on column {}", col);
    merged[col] += v;
  }
  if (row_begin.empty()) row_begin.push_back(0);
  for (const auto& [col, v] : merged) {
    if (v == 0) continue;
    row_col.push_back(col);
    row_val.push_back(v);
  }
  row_begin.push_back(static_cast<int>(row_col.size()));
  row_lb.push_back(lb);
  row_ub.push_back(ub);
}

namespace {

constexpr double kInf = 1e30;  // COIN's infinity is 1e30 by default

// A linear expression: constant + sum of coefficient * column.
struct Expr {
  double constant = 0;
  std::vector<std::pair<int, double>> terms;
  void add(int col, double v) {
    if (col >= 0 && v != 0) terms.emplace_back(col, v);
  }
};

}  // namespace

int ScheduleModel::span_col(int s, int e, bool keep) const {
  const int len = e - s;
  if (s < 0 || e > p_.num_layers || len < 1 || len > p_.max_span) return -1;
  return span_cols_[s][2 * len + (keep ? 1 : 0)];
}

int ScheduleModel::home_col(int i, Home h) const {
  if (i < 0 || i >= p_.num_layers) return -1;
  switch (h) {
    case Home::kGpu:
      return g_[i];
    case Home::kHost:
      return c_[i];
    case Home::kNvme:
      return n_[i];
    case Home::kRecompute:
      return -1;
  }
  return -1;
}

ScheduleModel::ScheduleModel(const PlanProblem& p, const Tier* minimize_tier) : p_(p) {
  const int L = p.num_layers;
  const int T = p.num_windows();
  const int R = p.max_span;
  const bool nvme = p.has_nvme();
  const auto& A = p.boundary_gb;
  // Weights as streamed (0 for GPU-resident layers: streamed_weight_gb).
  const auto W = [&](int j) { return streamed_weight_gb(p, j); };
  const bool min_mode = minimize_tier != nullptr;
  const double pen = min_mode ? 0.0 : p.move_penalty_ms_per_gb;
  const double time_w = min_mode ? 0.0 : 1.0;  // objective weight of time terms

  // Constant part of the objective: all non-recompute compute and the serial step overhead.
  for (const LayerCost& c : p.layers) m_.obj_constant += c.fwd_ms + c.bwd_ms;
  m_.obj_constant += p.loss_ms + p.step_fixed_ms + resident_serial_ms(p) + device_tail_serial_ms(p);
  if (min_mode) m_.obj_constant = 0;

  // Span columns; their objective carries the recompute time and the re-stream penalty.
  span_cols_.assign(L + 1, std::vector<int>(2 * R + 2, -1));
  for (int s = 0; s < L; ++s) {
    for (int len = 1; len <= R && s + len <= L; ++len) {
      double rec = 0, wsum = 0;
      for (int k = s; k <= s + len - 2; ++k) {
        rec += p.layers[k].rec_ms;
        wsum += W(k);
      }
      span_cols_[s][2 * len] = m_.add_col(0, 1, time_w * rec + pen * wsum, true);
      if (len >= 2) span_cols_[s][2 * len + 1] = m_.add_col(0, 1, time_w * rec, true);
    }
  }
  // Keep-internals columns: saves keep_saved_ms of the layer's backward window (negative cost) and
  // pays the tie-breaking penalty on the kept bytes, so equally fast plans keep less.
  keep_.assign(L, -1);
  for (int j = 0; j < L; ++j) {
    if (!keep_allowed(p, j)) continue;
    keep_[j] = m_.add_col(
        0, 1, -time_w * p.layers[j].keep_saved_ms + pen * p.layers[j].internals_gb, true);
  }
  // Homes of boundaries 0..L-1 (L feeds the loss on the GPU by rule: no columns). Boundary 0, the
  // embedding's output, is always materialized and may leave the GPU like any other.
  g_.assign(L + 1, -1);
  c_.assign(L + 1, -1);
  n_.assign(L + 1, -1);
  // An off-GPU home pays the measured host-home term (serial, per GB: PlanProblem
  // host_home_ms_per_gb) on its bytes; NVMe homes too, their bytes pass through host memory.
  for (int i = 0; i < L; ++i) {
    const double home_ms = time_w * p.host_home_ms_per_gb * A[i];
    g_[i] = m_.add_col(0, 1, 0, true);
    c_[i] = m_.add_col(0, 1, home_ms, true);
    if (nvme) n_[i] = m_.add_col(0, 1, home_ms, true);
  }
  // Some boundary on NVMe: the executor then holds its one pinned bounce buffer (nvme_bounce_gb)
  // for the whole run, charged once to the host row below. No cost of its own: n_i <= u.
  if (nvme) {
    any_nvme_ = m_.add_col(0, 1, 0, true);
    for (int i = 0; i < L; ++i) m_.add_row({{n_[i], 1}, {any_nvme_, -1}}, -kInf, 0);
  }
  // Transfer columns (GB), only in the windows evaluate.h allows; the H2D range is the widest
  // (span end i+1) and the deadline row below narrows it to the chosen span's end.
  xfer_.assign(L + 1, XferCols{});
  for (int i = 0; i < L; ++i) {
    XferCols& x = xfer_[i];
    x.first_d2h = first_d2h_window(p, i);
    x.first_h2d = first_h2d_window(p, i);
    for (int t = x.first_d2h; t <= last_d2h_window(p, i); ++t) {
      x.dc.push_back(m_.add_col(0, A[i], pen, false));
      // To NVMe only in window i (last_nvme_d2h_window): the executor stores it when produced.
      const bool nv = nvme && t <= last_nvme_d2h_window(p, i);
      x.dn.push_back(nv ? m_.add_col(0, A[i], pen, false) : -1);
    }
    for (int t = x.first_h2d; t <= last_h2d_window(p, i + 1); ++t) {
      x.hc.push_back(m_.add_col(0, A[i], pen, false));
      x.hn.push_back(nvme ? m_.add_col(0, A[i], pen, false) : -1);
    }
  }
  eps_.resize(T);
  for (int t = 0; t < T; ++t) eps_[t] = m_.add_col(0, kInf, time_w, false);
  if (min_mode) cap_col_ = m_.add_col(0, kInf, 1.0, false);
  // The CPU optimizer's two terms (rows at the end): forward windows held back by the update
  // (wait) and the step waiting for the update to finish beyond the GPU's work (bound), in ms.
  if (!min_mode && p.cpu_optimizer_ms > 0) {
    wait_col_ = m_.add_col(0, kInf, 1.0, false);
    bound_col_ = m_.add_col(0, kInf, 1.0, false);
  }

  const auto d2h_col = [&](int i, int t, bool to_nvme) {
    const XferCols& x = xfer_[i];
    const int k = t - x.first_d2h;
    if (k < 0 || k >= static_cast<int>(x.dc.size())) return -1;
    return to_nvme ? x.dn[k] : x.dc[k];
  };
  const auto h2d_col = [&](int i, int t, bool to_nvme) {
    const XferCols& x = xfer_[i];
    const int k = t - x.first_h2d;
    if (k < 0 || k >= static_cast<int>(x.hc.size())) return -1;
    return to_nvme ? x.hn[k] : x.hc[k];
  };

  // Path flow: one span leaves 0, one enters L, and an interior boundary has a span in and out
  // exactly when it is materialized (has a home).
  {
    Expr out0, inL;
    for (int e = 1; e <= L; ++e) {
      out0.add(span_col(0, e, false), 1);
      out0.add(span_col(0, e, true), 1);
    }
    for (int s = 0; s < L; ++s) {
      inL.add(span_col(s, L, false), 1);
      inL.add(span_col(s, L, true), 1);
    }
    m_.add_row(out0.terms, 1, 1);
    m_.add_row(inL.terms, 1, 1);
    Expr home0;  // boundary 0 has one home
    for (int col : {g_[0], c_[0], n_[0]}) home0.add(col, 1);
    m_.add_row(home0.terms, 1, 1);
  }
  for (int i = 1; i < L; ++i) {
    Expr in, out;
    for (int s = 0; s < i; ++s) {
      in.add(span_col(s, i, false), 1);
      in.add(span_col(s, i, true), 1);
    }
    for (int e = i + 1; e <= L; ++e) {
      out.add(span_col(i, e, false), 1);
      out.add(span_col(i, e, true), 1);
    }
    for (Expr* ex : {&in, &out}) {
      ex->add(g_[i], -1);
      ex->add(c_[i], -1);
      ex->add(n_[i], -1);
      m_.add_row(ex->terms, 0, 0);
    }
  }

  // An offloaded boundary moves out in full and back in full, in its tier.
  for (int i = 0; i < L; ++i) {
    const XferCols& x = xfer_[i];
    for (bool to_nvme : {false, true}) {
      if (to_nvme && !nvme) continue;
      Expr out, in;
      for (std::size_t k = 0; k < x.dc.size(); ++k) out.add(to_nvme ? x.dn[k] : x.dc[k], 1);
      for (std::size_t k = 0; k < x.hc.size(); ++k) in.add(to_nvme ? x.hn[k] : x.hc[k], 1);
      const int home = to_nvme ? n_[i] : c_[i];
      out.add(home, -A[i]);
      in.add(home, -A[i]);
      m_.add_row(out.terms, 0, 0);
      m_.add_row(in.terms, 0, 0);
    }
    // Deadline: H2D in window t only if the span leaving i ends at e <= 2L - t.
    for (int t = x.first_h2d; t < x.first_h2d + static_cast<int>(x.hc.size()); ++t) {
      Expr row;
      row.add(h2d_col(i, t, false), 1);
      row.add(h2d_col(i, t, true), 1);
      for (int e = i + 1; e <= std::min(L, 2 * L - t); ++e) {
        row.add(span_col(i, e, false), -A[i]);
        row.add(span_col(i, e, true), -A[i]);
      }
      m_.add_row(row.terms, -kInf, 0);
    }
  }

  // Capacity rows. In min-capacity mode the minimized tier's limit is the column M.
  const auto add_cap_row = [&](Expr ex, Tier tier, double cap) {
    if (min_mode && *minimize_tier == tier) {
      ex.add(cap_col_, -1);
      m_.add_row(ex.terms, -kInf, -ex.constant);
    } else {
      m_.add_row(ex.terms, -kInf, cap - ex.constant);
    }
  };
  {
    Expr host;
    host.constant = p.host_fixed_gb;
    for (int i = 0; i < L; ++i) host.add(c_[i], A[i]);
    host.add(any_nvme_, nvme_bounce_gb(p));  // the NVMe bounce buffer, once
    host_row_ = m_.num_rows();
    add_cap_row(host, Tier::kHost, p.host_cap_gb);
    if (nvme) {
      Expr nv;
      for (int i = 0; i < L; ++i) nv.add(n_[i], A[i]);
      nvme_row_ = m_.num_rows();
      add_cap_row(nv, Tier::kNvme, p.nvme_cap_gb);
    }
  }
  for (int t = 0; t < T; ++t) {
    Expr gpu;
    gpu.constant = p.gpu_fixed_gb + resident_gpu_gb(p) + device_tail_gpu_gb(p);
    if (t < L) gpu.constant += p.layers[t].work_fwd_gb;
    if (t == L) gpu.constant += p.loss_work_gb;
    if (t > L) gpu.constant += p.layers[2 * L - t].work_bwd_gb;
    if (t == L - 1 || t == L) gpu.constant += A[L];
    for (int i = 0; i < L; ++i) {
      if (t == i - 1 || t == i) {
        // Written by layer i-1 (boundary 0: by the embedding, before window 0), read by layer i:
        // resident whatever its home.
        gpu.constant += A[i];
        continue;
      }
      if (t > i && t <= 2 * L - i) gpu.add(g_[i], A[i]);
      if (t > i && t < L) {  // offloaded, not yet fully out: A_i (c + n) - bytes sent before t
        gpu.add(c_[i], A[i]);
        gpu.add(n_[i], A[i]);
        for (int u = i; u < t; ++u) {
          gpu.add(d2h_col(i, u, false), -1);
          gpu.add(d2h_col(i, u, true), -1);
        }
      }
      if (t >= L && t <= 2 * L - i) {  // brought back: bytes arrived up to and including t
        for (int u = L; u <= t; ++u) {
          gpu.add(h2d_col(i, u, false), 1);
          gpu.add(h2d_col(i, u, true), 1);
        }
      }
    }
    // Kept internals of layer j: from its forward window j through its backward window 2L-j.
    for (int j = 0; j < L; ++j) {
      if (t >= j && t <= 2 * L - j) gpu.add(keep_[j], p.layers[j].internals_gb);
    }
    if (t > L) {  // backward of layer j: recomputed boundaries and kept weights of its span
      const int j = 2 * L - t;
      for (int s = std::max(0, j - R + 1); s <= j; ++s) {
        for (int e = std::max(j + 1, s + 2); e <= std::min(L, s + R); ++e) {
          double rec_bytes = 0, kept_bytes = 0;
          for (int k = s + 1; k <= j; ++k) rec_bytes += A[k];
          for (int k = s; k <= std::min(j, e - 2); ++k) kept_bytes += W(k);
          gpu.add(span_col(s, e, false), rec_bytes);
          gpu.add(span_col(s, e, true), rec_bytes + kept_bytes);
        }
      }
    }
    add_cap_row(gpu, Tier::kGpu, p.gpu_cap_gb);
  }

  // Exposure rows: eps_t >= (bytes / rate) - compute_t for each link direction and for the NVMe
  // fetches (read then H2D through the one bounce buffer: nvme_fetch_ms_per_gb), and
  // eps_t >= the NVMe stores waited for at the end of window t (nvme_store_ms_per_gb x the bytes
  // of the NVMe homes it produced: serial, no compute hides them; their D2H is not on the link
  // rows). The device optimizer tail's H2D (constants per forward window: device_tail_h2d_gb)
  // shares the link with each window's own traffic.
  const std::vector<double> tail_h2d = device_tail_h2d_gb(p);
  for (int t = 0; t < T; ++t) {
    Expr compute, h2d, d2h, nv_read, store;
    if (t < L) {
      compute.constant = p.layers[t].fwd_ms;
      h2d.constant = t + 1 < L ? W(t + 1) : p.head_weight_gb;
    } else if (t == L) {
      compute.constant = p.loss_ms;
      h2d.constant = W(L - 1);
    } else {
      const int j = 2 * L - t;
      compute.constant = p.layers[j].bwd_ms;
      compute.add(keep_[j], -p.layers[j].keep_saved_ms);  // kept internals: no re-forward
      d2h.constant = j == L - 1 ? p.head_grad_gb : drained_grad_gb(p, j + 1);
      if (j >= 1) {
        // Prefetch of layer j-1's weights, unless a keep span already holds them.
        h2d.constant = W(j - 1);
        for (int s = std::max(0, j - R + 1); s <= j - 1; ++s) {
          for (int e = j + 1; e <= std::min(L, s + R); ++e)
            h2d.add(span_col(s, e, true), -W(j - 1));
        }
      }
      // Spans ending at j+1 recompute layers s..j-1 here and stream their weights here.
      for (int s = std::max(0, j + 1 - R); s <= j - 1; ++s) {
        double rec = 0, wsum = 0;
        for (int k = s; k <= j - 1; ++k) {
          rec += p.layers[k].rec_ms;
          wsum += W(k);
        }
        for (bool keep : {false, true}) {
          compute.add(span_col(s, j + 1, keep), rec);
          h2d.add(span_col(s, j + 1, keep), wsum);
        }
      }
    }
    h2d.constant += tail_h2d[t];
    for (int i = 0; i < L; ++i) {
      d2h.add(d2h_col(i, t, false), 1);
      for (bool to_nvme : {false, true}) h2d.add(h2d_col(i, t, to_nvme), 1);
      nv_read.add(h2d_col(i, t, true), 1);
      if (nvme && nvme_store_window(p, i) == t) store.add(n_[i], A[i]);
    }
    const double duplex = t >= L ? p.link.duplex_loaded_gbps : p.link.duplex_gbps;
    // ms_per_gb * bytes - compute - eps <= 0
    const auto add_exposure = [&](const std::vector<const Expr*>& bytes, double k) {
      Expr row;
      double constant = 0;
      for (const Expr* b : bytes) {
        constant += k * b->constant;
        for (const auto& [col, v] : b->terms) row.add(col, k * v);
      }
      constant -= compute.constant;
      for (const auto& [col, v] : compute.terms) row.add(col, -v);
      row.add(eps_[t], -1);
      m_.add_row(row.terms, -kInf, -constant);
    };
    add_exposure({&h2d}, 1e3 / p.link.h2d_gbps);
    add_exposure({&d2h}, 1e3 / p.link.d2h_gbps);
    add_exposure({&h2d, &d2h}, 1e3 / duplex);
    if (nvme) {
      if (!nv_read.terms.empty()) add_exposure({&nv_read}, nvme_fetch_ms_per_gb(p));
      if (!store.terms.empty()) {  // eps_t - k sum A_i n_i >= 0
        Expr row;
        row.add(eps_[t], 1);
        for (const auto& [col, v] : store.terms) row.add(col, -nvme_store_ms_per_gb(p) * v);
        m_.add_row(row.terms, 0, kInf);
      }
    }
  }

  // The optimizer gate. Forward window j starts at max(end of window j-1, U_j) and lasts
  // w_j = fwd_j + eps_j, so the forward pass ends at max_k (U_k + sum_{m>=k} w_m) (U_0 = 0) and
  // the time it is held back is wait = max(0, max_k (U_k - sum_{m<k} (fwd_m + eps_m))): linear
  // rows, one per layer k, with wait minimized in the objective. (An eps above its exposure rows'
  // minimum lowers wait by at most as much, so the optimum is unchanged: docs/plan.md.)
  if (wait_col_ >= 0) {
    const std::vector<double> ready = optimizer_ready_ms(p);
    double fwd_before = 0;  // sum_{m<k} fwd_m
    for (int k = 1; k < L; ++k) {
      fwd_before += p.layers[k - 1].fwd_ms;
      if (ready[k] - fwd_before <= 0) continue;  // never binds: wait, eps >= 0
      Expr row;
      row.add(wait_col_, 1);
      for (int m = 0; m < k; ++m) row.add(eps_[m], 1);
      m_.add_row(row.terms, ready[k] - fwd_before, kInf);
    }
    // The step is never shorter than the whole update: bound >= optimizer_phase_ms (without the
    // device tail: cpu_optimizer_ms) - (gpu step + wait), the gpu step being the constant compute
    // plus recompute plus exposure minus the re-forwards kept internals save.
    Expr row;
    row.add(bound_col_, 1);
    row.add(wait_col_, 1);
    for (int t = 0; t < T; ++t) row.add(eps_[t], 1);
    for (int j = 0; j < L; ++j) row.add(keep_[j], -p.layers[j].keep_saved_ms);
    for (int s = 0; s < L; ++s) {
      for (int e = s + 2; e <= std::min(L, s + R); ++e) {
        double rec = 0;
        for (int k = s; k <= e - 2; ++k) rec += p.layers[k].rec_ms;
        row.add(span_col(s, e, false), rec);
        row.add(span_col(s, e, true), rec);
      }
    }
    m_.add_row(row.terms, optimizer_phase_ms(p) - m_.obj_constant, kInf);
  }
  // The resident-saving term: after the optimizer's max (so not in the row above), and a constant
  // at this problem's K.
  m_.obj_constant -= time_w * resident_saved_total_ms(p);
}

void ScheduleModel::fix_choice(const std::vector<Home>& homes, const std::vector<Span>& spans,
                               const std::vector<bool>& keep) {
  const int L = p_.num_layers;
  FERRY_CHECK(keep.empty() || static_cast<int>(keep.size()) == L,
              "plan: fix_choice: {} keep flags for {} layers", keep.size(), L);
  for (int j = 0; j < L; ++j) {
    const bool kept = !keep.empty() && keep[j];
    if (keep_[j] < 0) {
      FERRY_CHECK(!kept, "plan: fix_choice: layer {} keeps internals but has no keep choice", j);
      continue;
    }
    m_.col_lb[keep_[j]] = m_.col_ub[keep_[j]] = kept ? 1 : 0;
  }
  for (int s = 0; s <= L; ++s) {
    for (int col : span_cols_[s]) {
      if (col >= 0) m_.col_lb[col] = m_.col_ub[col] = 0;
    }
  }
  for (const Span& s : spans) {
    const int col = span_col(s.start, s.end, s.keep_weights);
    FERRY_CHECK(col >= 0, "plan: fix_choice: span [{}, {}] not in the model", s.start, s.end);
    m_.col_lb[col] = m_.col_ub[col] = 1;
  }
  bool on_nvme = false;
  for (int i = 0; i < L; ++i) {
    for (Home h : {Home::kGpu, Home::kHost, Home::kNvme}) {
      const int col = home_col(i, h);
      if (col < 0) {
        FERRY_CHECK(homes[i] != h, "plan: fix_choice: home {} not in the model", to_string(h));
        continue;
      }
      m_.col_lb[col] = m_.col_ub[col] = homes[i] == h ? 1 : 0;
    }
    on_nvme = on_nvme || homes[i] == Home::kNvme;
  }
  if (any_nvme_ >= 0) m_.col_lb[any_nvme_] = m_.col_ub[any_nvme_] = on_nvme ? 1 : 0;
}

Plan ScheduleModel::extract_plan(const std::vector<double>& sol) const {
  const int L = p_.num_layers;
  FERRY_CHECK(static_cast<int>(sol.size()) == m_.num_cols(), "plan: solution has {} of {} columns",
              sol.size(), m_.num_cols());
  Plan plan;
  plan.num_layers = L;
  plan.batch_size = p_.batch_size;
  plan.seq_len = p_.seq_len;
  plan.resident_layers = resident_count(p_);
  plan.device_update_layers = device_tail_layers(p_);
  plan.homes.assign(L + 1, Home::kRecompute);
  plan.homes[L] = Home::kGpu;
  for (int s = 0; s < L;) {
    int next = -1;
    for (int e = s + 1; e <= std::min(L, s + p_.max_span) && next < 0; ++e) {
      for (bool keep : {false, true}) {
        const int col = span_col(s, e, keep);
        if (col >= 0 && sol[col] > 0.5) {
          plan.spans.push_back(Span{s, e, keep});
          next = e;
          break;
        }
      }
    }
    FERRY_CHECK(next > s, "plan: solution has no span leaving boundary {}", s);
    s = next;
  }
  for (int i = 0; i < L; ++i) {
    for (Home h : {Home::kGpu, Home::kHost, Home::kNvme}) {
      const int col = home_col(i, h);
      if (col >= 0 && sol[col] > 0.5) plan.homes[i] = h;
    }
  }
  for (int j = 0; j < L; ++j) {
    if (keep_[j] >= 0 && sol[keep_[j]] > 0.5) {
      plan.keep_internals.resize(L, false);
      plan.keep_internals[j] = true;
    }
  }
  // Transfers below 1 byte are solver noise.
  constexpr double kMinGb = 1e-9;
  for (int i = 0; i < L; ++i) {
    const XferCols& x = xfer_[i];
    for (std::size_t k = 0; k < x.dc.size(); ++k) {
      const int t = x.first_d2h + static_cast<int>(k);
      for (bool to_nvme : {false, true}) {
        const int col = to_nvme ? x.dn[k] : x.dc[k];
        if (col >= 0 && sol[col] > kMinGb)
          plan.transfers.push_back({i, t, false, to_nvme, sol[col]});
      }
    }
    for (std::size_t k = 0; k < x.hc.size(); ++k) {
      const int t = x.first_h2d + static_cast<int>(k);
      for (bool to_nvme : {false, true}) {
        const int col = to_nvme ? x.hn[k] : x.hc[k];
        if (col >= 0 && sol[col] > kMinGb)
          plan.transfers.push_back({i, t, true, to_nvme, sol[col]});
      }
    }
  }
  return plan;
}

}  // namespace ferry::plan
