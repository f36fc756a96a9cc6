// SPDX-License-Identifier: Apache-2.0
// Paper-data replay (see paper_replay.h).
#include "route/paper_replay.h"

#include <algorithm>

namespace ferry::route {

Result<PaperReplay> replay_paper_data(const std::string& dir) {
  PaperReplay p;
  FERRY_ASSIGN_OR_RETURN(CsvTable results, CsvTable::load(dir + "/offloading_results.csv"));
  FERRY_ASSIGN_OR_RETURN(p.curves, curves_from_csv(results));
  for (const char* need : {kPaperSkipEstimator, kPaperCondEstimator}) {
    if (!p.curves.count(need)) {
      return corrupt("route: {}/offloading_results.csv has no curve for '{}'", dir, need);
    }
  }
  const Curve& skip = p.curves.at(kPaperSkipEstimator);
  const Curve& cond = p.curves.at(kPaperCondEstimator);
  FERRY_ASSIGN_OR_RETURN(p.envelope, adaptive_envelope(skip, cond));
  for (const auto& [name, c] : p.curves) {
    FERRY_ASSIGN_OR_RETURN(p.auc[name], auc_trapezoid(c.ratio, c.map));
    p.peak[name] = *std::max_element(c.map.begin(), c.map.end());
  }
  FERRY_ASSIGN_OR_RETURN(p.auc["adaptive"], auc_trapezoid(p.envelope.ratio, p.envelope.map));
  p.peak["adaptive"] = *std::max_element(p.envelope.map.begin(), p.envelope.map.end());

  FERRY_ASSIGN_OR_RETURN(CsvTable metrics, CsvTable::load(dir + "/estimator_metrics.csv"));
  FERRY_ASSIGN_OR_RETURN(p.cost, cost_model_from_metrics(metrics, kPaperSkipEstimator));
  const double r = p.rho_cost;
  p.saving_ms = p.cost.latency_saving_ms(r);
  p.saving_pct = 100.0 * p.saving_ms / p.cost.latency_ms(Placement::kCond, r);
  p.gflops_saved =
      p.cost.edge_gflops(Placement::kCond, r) - p.cost.edge_gflops(Placement::kSkip, r);
  p.latency_break_even = p.cost.latency_break_even();
  p.compute_break_even = p.cost.compute_break_even();
  p.lightness = p.cost.g_weak / p.cost.g_est_skip;
  return p;
}

}  // namespace ferry::route
