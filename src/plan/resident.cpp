// SPDX-License-Identifier: Apache-2.0
#include "plan/resident.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "core/check.h"
#include "core/log.h"

namespace ferry::plan {

PlanProblem at_resident(const PlanProblem& p, int k) {
  PlanProblem q = p;
  q.resident_layers = std::clamp(k, 0, p.num_layers);
  return q;
}

Result<ResidentSearch> search_resident(const PlanProblem& p, const Planner& solve, int forced,
                                       int reserve_top) {
  const int L = std::max(0, p.num_layers - std::max(0, reserve_top));  // the largest K tried
  ResidentSearch r;
  std::optional<Plan> best;
  double best_obj = std::numeric_limits<double>::infinity();
  int first_misfit = L + 1;  // the smallest K known not to fit
  // Solves at K; false when nothing fits (K > 0) — then every larger K does not fit either.
  const auto try_k = [&](int k) -> Result<bool> {
    if (k >= first_misfit) return false;
    if (std::find(r.tried.begin(), r.tried.end(), k) != r.tried.end()) return true;
    Result<Plan> s = solve(at_resident(p, k));
    r.tried.push_back(k);
    if (!s.ok()) {
      r.objective_ms.push_back(std::numeric_limits<double>::infinity());
      const StatusCode code = s.status().code();
      const bool misfit =
          code == StatusCode::kResourceExhausted || code == StatusCode::kDeadlineExceeded;
      if (k == 0 || forced >= 0 || !misfit) return std::move(s).take_status();
      first_misfit = std::min(first_misfit, k);
      return false;
    }
    FERRY_CHECK(s->resident_layers == k, "plan: solved at {} resident layers, asked {}",
                s->resident_layers, k);
    const double obj = s->predicted.objective_ms;
    r.objective_ms.push_back(obj);
    if (obj < best_obj - 1e-9 ||
        (std::abs(obj - best_obj) <= 1e-9 && best && k < best->resident_layers)) {
      best_obj = obj;
      best = std::move(s).value();
    }
    return true;
  };
  if (forced >= 0) {
    FERRY_ASSIGN_OR_RETURN(const bool fit, try_k(std::min(forced, L)));
    (void)fit;
  } else if (L <= kResidentExhaustiveLayers) {
    for (int k = 0; k <= L; ++k) {
      FERRY_ASSIGN_OR_RETURN(const bool fit, try_k(k));
      if (!fit) break;
    }
  } else {
    const int stride = (L + 7) / 8;
    for (int k = 0;; k = std::min(L, k + stride)) {
      FERRY_ASSIGN_OR_RETURN(const bool fit, try_k(k));
      if (!fit || k == L) break;
    }
    const int centre = best->resident_layers;
    for (int k = std::max(0, centre - stride + 1); k <= std::min(L, centre + stride - 1); ++k) {
      FERRY_ASSIGN_OR_RETURN(const bool fit, try_k(k));
      if (!fit) break;
    }
  }
  FERRY_CHECK(best.has_value(), "plan: resident search without a plan");
  r.plan = std::move(*best);
  return r;
}

Planner resident_planner(Planner solve, int forced, int reserve_top) {
  return [solve = std::move(solve), forced, reserve_top](const PlanProblem& p) -> Result<Plan> {
    FERRY_ASSIGN_OR_RETURN(ResidentSearch s, search_resident(p, solve, forced, reserve_top));
    log::get("plan")->debug("plan at batch {}: resident layers {} (tried {})", p.batch_size,
                            s.plan.resident_layers, s.tried.size());
    return std::move(s.plan);
  };
}

}  // namespace ferry::plan
