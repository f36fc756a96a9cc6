// SPDX-License-Identifier: Apache-2.0
#include "plan/device_tail.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "core/check.h"
#include "core/log.h"
#include "plan/evaluate.h"

namespace ferry::plan {
namespace {

constexpr double kTieMs = 1e-9;  // as the resident search

// a's gate is <= b's in every U_j and in the phase (exact: a pruned K is never better).
bool gate_leq(const TailGate& a, const TailGate& b) {
  if (a.phase_ms > b.phase_ms || a.serial_ms > b.serial_ms) return false;
  for (std::size_t j = 0; j < a.ready_ms.size(); ++j) {
    if (a.ready_ms[j] > b.ready_ms[j]) return false;
  }
  for (std::size_t t = 0; t < a.h2d_gb.size(); ++t) {
    if (a.h2d_gb[t] > b.h2d_gb[t]) return false;
  }
  return true;
}

bool gate_eq(const TailGate& a, const TailGate& b) {
  return a.phase_ms == b.phase_ms && a.ready_ms == b.ready_ms && a.h2d_gb == b.h2d_gb &&
         a.serial_ms == b.serial_ms;
}

bool misfit(const Status& s) {
  return s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kDeadlineExceeded;
}

}  // namespace

PlanProblem at_device_tail(const PlanProblem& p, int k) {
  PlanProblem q = p;
  q.device_update_layers = std::clamp(k, 0, p.num_layers);
  return q;
}

std::vector<TailGate> distinct_tail_gates(const PlanProblem& p) {
  const int k_max = std::max(0, p.num_layers - resident_count(p));
  std::vector<TailGate> gates;
  for (int k = 0; k <= k_max; ++k) {
    const PlanProblem q = at_device_tail(p, k);
    TailGate g{.k = k,
               .ready_ms = optimizer_ready_ms(q),
               .phase_ms = optimizer_phase_ms(q),
               .h2d_gb = device_tail_h2d_gb(q),
               .serial_ms = device_tail_serial_ms(q)};
    // K = 0 stays apart (no staging); a K > 0 with a smaller K > 0's gate adds nothing.
    const bool seen = k > 0 && std::any_of(gates.begin(), gates.end(), [&](const TailGate& h) {
                        return h.k > 0 && gate_eq(h, g);
                      });
    if (!seen) gates.push_back(std::move(g));
  }
  return gates;
}

Result<DeviceTailSearch> search_device_tail(const PlanProblem& p, const Planner& solve) {
  const std::vector<TailGate> gates = distinct_tail_gates(p);
  FERRY_CHECK(!gates.empty() && gates[0].k == 0, "plan: tail gates without K = 0");
  const int n = static_cast<int>(gates.size());
  // Per gate: dominated by a smaller K (never the answer: at least as good and smaller), or by a
  // larger one only (not solved; may tie with the best: priced with the best plan below).
  std::vector<bool> by_smaller(n, false), by_larger(n, false);
  for (int a = 1; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (b == a) continue;
      if (!gate_leq(gates[b], gates[a])) continue;
      // K = 0 needs less memory than any K > 0; two K > 0 need the same.
      if (gates[b].k < gates[a].k) {
        by_smaller[a] = true;
      } else {
        by_larger[a] = true;
      }
    }
  }
  DeviceTailSearch r;
  r.gates = n;
  std::optional<Plan> best;
  double best_obj = std::numeric_limits<double>::infinity();
  for (int a = 0; a < n; ++a) {
    if (by_smaller[a] || by_larger[a]) continue;
    const int k = gates[a].k;
    Result<Plan> s = solve(at_device_tail(p, k));
    r.solved.push_back(k);
    if (!s.ok()) {
      r.objective_ms.push_back(std::numeric_limits<double>::infinity());
      // Nothing fits at K = 0: nor with the staging. At K > 0: the staging does not fit.
      if (k == 0 || !misfit(s.status())) return std::move(s).take_status();
      continue;
    }
    s->device_update_layers = device_tail_layers(at_device_tail(p, k));
    const double obj = s->predicted.objective_ms;
    r.objective_ms.push_back(obj);
    if (obj < best_obj - kTieMs) {  // K ascending: a tie keeps the smaller K
      best_obj = obj;
      best = std::move(s).value();
    }
  }
  FERRY_CHECK(best.has_value(), "plan: tail search without a plan");
  // A K below the best's that only larger K dominate is at least as slow as the best; it ties if
  // the best plan priced with its gate costs the same (same memory: both K > 0; with best K = 0
  // the loop does not start).
  const int best_k = best->device_update_layers;
  for (int a = 1; a < n && gates[a].k < best_k; ++a) {
    if (by_smaller[a] || !by_larger[a]) continue;
    const PlanProblem q = at_device_tail(p, gates[a].k);
    FERRY_ASSIGN_OR_RETURN(Prediction pr, evaluate(q, *best));
    if (pr.objective_ms > best_obj + kTieMs) continue;
    pr.gpu_peak_gb = best->predicted.gpu_peak_gb;  // the executor's bytes when it counted them
    best->predicted = pr;
    best->solver.objective_ms = pr.objective_ms;
    best->device_update_layers = device_tail_layers(q);
    break;
  }
  r.plan = std::move(*best);
  return r;
}

Planner device_tail_planner(Planner solve) {
  return [solve = std::move(solve)](const PlanProblem& p) -> Result<Plan> {
    FERRY_ASSIGN_OR_RETURN(DeviceTailSearch s, search_device_tail(p, solve));
    log::get("plan")->debug("plan at batch {}: device tail {} ({} gates, {} solved)", p.batch_size,
                            s.plan.device_update_layers, s.gates, s.solved.size());
    return std::move(s.plan);
  };
}

}  // namespace ferry::plan
