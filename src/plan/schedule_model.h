// SPDX-License-Identifier: Apache-2.0
// ScheduleModel: the planner's mixed-integer program (docs/plan.md, "formulation") as plain
// arrays — columns with bounds, objective and integrality, rows as sparse terms with bounds — plus
// the index maps that tie each column to its meaning. It knows nothing about CBC: milp.cpp hands
// it to CBC, lp_fixed.cpp fixes its binaries and hands it to Clp, and extract_plan() turns a
// solution vector back into a Plan (which evaluate.h then prices independently).
//
// Variables: x[s,e,v] (span s->e, v = re-stream / keep weights), g/c/n[i] (home of boundary i),
// k[j] (layer j keeps its internals from its forward to its backward; only where keep_allowed),
// u (some boundary is on NVMe, so the executor holds its host bounce buffer; with NVMe only),
// dc/dn[i,t] (D2H bytes of i in window t, to host / to NVMe: dn only in window i, the NVMe store's
// time being a row of its own per forward window), hc/hn[i,t] (H2D bytes), eps[t] (exposure of
// window t, ms), wait and bound (ms: the forward held back by the CPU optimizer, and
// the optimizer outlasting the GPU's step; only when the problem has an optimizer time), and in a
// min-capacity model one capacity column M.
#pragma once

#include <utility>
#include <vector>

#include "plan/plan.h"
#include "plan/problem.h"

namespace ferry::plan {

enum class Tier : std::uint8_t { kGpu, kHost, kNvme };
std::string_view to_string(Tier t);

struct LinearModel {
  std::vector<double> col_lb, col_ub, obj;
  std::vector<char> integer;
  std::vector<int> row_begin;  // [rows+1] into row_col / row_val
  std::vector<int> row_col;
  std::vector<double> row_val;
  std::vector<double> row_lb, row_ub;
  double obj_constant = 0;

  int num_cols() const { return static_cast<int>(col_lb.size()); }
  int num_rows() const { return static_cast<int>(row_lb.size()); }
  int add_col(double lb, double ub, double cost, bool is_integer);
  // Terms with the same column are summed; zero coefficients dropped.
  void add_row(std::vector<std::pair<int, double>> terms, double lb, double ub);
};

class ScheduleModel {
 public:
  // minimize_tier: when set, that tier's capacity becomes a column M and the objective is M alone
  // (the smallest capacity of that tier for which some plan fits the other tiers).
  ScheduleModel(const PlanProblem& p, const Tier* minimize_tier = nullptr);

  const LinearModel& model() const { return m_; }
  LinearModel& mutable_model() { return m_; }

  // Column of span (s, e) with variant keep (false: re-stream); -1 when it does not exist.
  int span_col(int s, int e, bool keep) const;
  int home_col(int i, Home h) const;  // g/c/n of boundary 0..L-1; -1 if absent (nvme off, L)
  int keep_col(int j) const { return keep_[j]; }  // k of layer j; -1 if not keep_allowed
  int any_nvme_col() const { return any_nvme_; }  // u: some boundary on NVMe; -1 without NVMe
  int capacity_col() const { return cap_col_; }
  // The host and NVMe capacity rows (-1: no NVMe tier). The exact solver relaxes them and checks
  // those two tiers itself (exact.cpp): they do not depend on the schedule.
  int host_row() const { return host_row_; }
  int nvme_row() const { return nvme_row_; }

  // Bounds that fix every binary to the given discrete choice (an LP remains). keep: [L] or empty
  // (nothing kept); keeping a layer without a keep column is a bug.
  void fix_choice(const std::vector<Home>& homes, const std::vector<Span>& spans,
                  const std::vector<bool>& keep = {});

  // Reads a solution vector (num_cols values) into a Plan's homes, spans, kept internals (empty
  // when none) and transfers.
  Plan extract_plan(const std::vector<double>& sol) const;

 private:
  struct XferCols {
    int first_d2h = 0, first_h2d = 0;
    std::vector<int> dc, dn, hc, hn;  // per window from first_*; -1 when absent
  };
  const PlanProblem& p_;
  LinearModel m_;
  std::vector<std::vector<int>> span_cols_;  // [s][2*(e-s)+keep]
  std::vector<int> g_, c_, n_;               // [L+1], -1 at 0 and L
  std::vector<int> keep_;                    // [L], -1 where the layer has no keep choice
  std::vector<XferCols> xfer_;               // [L+1]
  std::vector<int> eps_;                     // [2L+1]
  int any_nvme_ = -1;  // u >= n_i: the NVMe bounce buffer is held; -1 without an NVMe tier
  int host_row_ = -1;  // the host capacity row
  int nvme_row_ = -1;  // the NVMe capacity row, -1 without an NVMe tier
  int cap_col_ = -1;
  int wait_col_ = -1;   // optimizer wait (ms), -1 without an optimizer term
  int bound_col_ = -1;  // step beyond the GPU's work waiting for the optimizer (ms)
};

}  // namespace ferry::plan
