// SPDX-License-Identifier: Apache-2.0
// Latency/compute model and the cost-aware router (see cost_model.h).
#include "route/cost_model.h"

#include <algorithm>

namespace ferry::route {

double NetworkModel::transfer_ms() const {
  const double upload = uplink_mbps > 0 ? frame_bytes * 8.0 / (uplink_mbps * 1e3) : 0.0;
  return rtt_ms + upload + server_queue_ms;
}

double CostModel::latency_ms(Placement p, double rho) const {
  const double remote = rho * (t_strong_ms + net.transfer_ms());
  if (p == Placement::kCond) return t_weak_ms + t_est_cond_ms + remote;
  return t_est_skip_ms + (1.0 - rho) * t_weak_ms + remote;
}

double CostModel::edge_gflops(Placement p, double rho) const {
  return p == Placement::kCond ? g_weak : g_est_skip + (1.0 - rho) * g_weak;
}

double CostModel::latency_saving_ms(double rho) const {
  return latency_ms(Placement::kCond, rho) - latency_ms(Placement::kSkip, rho);
}

double CostModel::latency_break_even() const { return (t_est_skip_ms - t_est_cond_ms) / t_weak_ms; }

double CostModel::compute_break_even() const { return g_est_skip / g_weak; }

double CostModel::sustainable_rho(double fps) const {
  if (net.uplink_mbps <= 0 || net.frame_bytes <= 0 || fps <= 0) return 1.0;
  return std::min(1.0, net.uplink_mbps * 1e6 / (fps * net.frame_bytes * 8.0));
}

Result<CostModel> cost_model_from_metrics(const CsvTable& t, const std::string& skip_estimator) {
  CostModel m;
  bool weak = false, strong = false, est = false;
  for (std::size_t r = 0; r < t.rows(); ++r) {
    FERRY_ASSIGN_OR_RETURN(std::string name, t.cell(r, "estimator"));
    if (name == "weak_model") {
      FERRY_ASSIGN_OR_RETURN(m.t_weak_ms, t.number(r, "detector_time_ms"));
      FERRY_ASSIGN_OR_RETURN(m.g_weak, t.number(r, "gflops"));
      weak = true;
    } else if (name == "strong_model") {
      FERRY_ASSIGN_OR_RETURN(m.t_strong_ms, t.number(r, "detector_time_ms"));
      FERRY_ASSIGN_OR_RETURN(m.g_strong, t.number(r, "gflops"));
      strong = true;
    } else if (name == skip_estimator) {
      FERRY_ASSIGN_OR_RETURN(m.t_est_skip_ms, t.number(r, "inference_time_ms"));
      FERRY_ASSIGN_OR_RETURN(m.g_est_skip, t.number(r, "gflops"));
      est = true;
    }
  }
  if (!weak || !strong || !est) {
    return corrupt("route: estimator metrics lack rows weak_model/strong_model/'{}'",
                   skip_estimator);
  }
  if (m.t_weak_ms <= 0 || m.g_weak <= 0) {
    return corrupt("route: estimator metrics: weak detector time/GFLOPs must be positive");
  }
  return m;
}

Placement cost_aware_choice(const CostModel& m, double rho, double map_skip, double map_cond,
                            double lambda_per_ms) {
  const double u_skip = map_skip - lambda_per_ms * m.latency_ms(Placement::kSkip, rho);
  const double u_cond = map_cond - lambda_per_ms * m.latency_ms(Placement::kCond, rho);
  return u_skip > u_cond ? Placement::kSkip : Placement::kCond;
}

Result<Router> cost_aware_router(const CostModel& m, const Curve& skip, const Curve& cond,
                                 double lambda_per_ms) {
  if (skip.ratio != cond.ratio || skip.ratio.size() < 2) {
    return invalid_argument("route: cost-aware router: curves do not share a ratio grid");
  }
  std::vector<Placement> p;
  for (std::size_t i = 0; i < skip.ratio.size(); ++i) {
    p.push_back(cost_aware_choice(m, skip.ratio[i], skip.map[i], cond.map[i], lambda_per_ms));
  }
  return Router(skip.ratio, std::move(p));
}

}  // namespace ferry::route
