// SPDX-License-Identifier: Apache-2.0
// Curves, AUC, envelope and the router table (see curves.h).
#include "route/curves.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

namespace ferry::route {

std::string_view to_string(Placement p) { return p == Placement::kSkip ? "skip" : "cond"; }

Result<std::map<std::string, Curve>> curves_from_csv(const CsvTable& t) {
  std::map<std::string, Curve> out;
  for (std::size_t r = 0; r < t.rows(); ++r) {
    FERRY_ASSIGN_OR_RETURN(std::string name, t.cell(r, "estimator"));
    FERRY_ASSIGN_OR_RETURN(double ratio, t.number(r, "ratio"));
    FERRY_ASSIGN_OR_RETURN(double m, t.number(r, "mAP"));
    FERRY_ASSIGN_OR_RETURN(double mc, t.number(r, "mAP_coco"));
    FERRY_ASSIGN_OR_RETURN(double m50, t.number(r, "mAP_coco50"));
    Curve& c = out[name];
    c.name = name;
    c.ratio.push_back(ratio);
    c.map.push_back(m);
    c.map_coco.push_back(mc);
    c.map_coco50.push_back(m50);
  }
  for (auto& [name, c] : out) {
    std::vector<std::size_t> idx(c.ratio.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](auto a, auto b) { return c.ratio[a] < c.ratio[b]; });
    Curve s{name, {}, {}, {}, {}};
    for (auto i : idx) {
      s.ratio.push_back(c.ratio[i]);
      s.map.push_back(c.map[i]);
      s.map_coco.push_back(c.map_coco[i]);
      s.map_coco50.push_back(c.map_coco50[i]);
    }
    c = std::move(s);
  }
  return out;
}

std::string curves_to_csv(const std::vector<Curve>& curves) {
  std::string out = "estimator,ratio,mAP,mAP_coco,mAP_coco50\n";
  for (const Curve& c : curves) {
    for (std::size_t i = 0; i < c.ratio.size(); ++i) {
      out += fmt::format("{},{},{},{},{}\n", c.name, c.ratio[i], c.map[i], c.map_coco[i],
                         c.map_coco50[i]);
    }
  }
  return out;
}

Result<double> auc_trapezoid(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size() || x.size() < 2) {
    return invalid_argument("route: auc: need >= 2 points with matching sizes (x {}, y {})",
                            x.size(), y.size());
  }
  double a = 0;
  for (std::size_t i = 1; i < x.size(); ++i) a += (x[i] - x[i - 1]) * (y[i] + y[i - 1]) / 2;
  return a;
}

Result<Envelope> adaptive_envelope(const Curve& skip, const Curve& cond) {
  if (skip.ratio != cond.ratio || skip.ratio.empty()) {
    return invalid_argument("route: envelope: '{}' and '{}' do not share a ratio grid", skip.name,
                            cond.name);
  }
  Envelope e;
  e.ratio = skip.ratio;
  for (std::size_t i = 0; i < e.ratio.size(); ++i) {
    const bool s = skip.map[i] > cond.map[i];
    e.choice.push_back(s ? Placement::kSkip : Placement::kCond);
    e.map.push_back(s ? skip.map[i] : cond.map[i]);
    if (s && e.frontier > 1) e.frontier = e.ratio[i];
    if (!s && e.frontier <= 1 && e.ceiling > 1) e.ceiling = e.ratio[i];
  }
  return e;
}

Router::Router(const Envelope& env) : grid_(env.ratio), placement_(env.choice) {}

Router::Router(std::vector<double> grid, std::vector<Placement> placement)
    : grid_(std::move(grid)), placement_(std::move(placement)) {}

Placement Router::placement(double rho) const {
  if (placement_.empty()) return Placement::kCond;
  const double k = static_cast<double>(placement_.size() - 1);
  const double r = std::clamp(rho, 0.0, 1.0);
  return placement_[static_cast<std::size_t>(std::lround(r * k))];
}

Json Router::to_json() const {
  Json j;
  j["grid"] = grid_;
  Json p = Json::array();
  for (Placement x : placement_) p.push_back(std::string(to_string(x)));
  j["placement"] = p;
  return j;
}

Result<Router> Router::from_json(const Json& j) {
  if (!j.is_object() || !j.contains("grid") || !j.contains("placement") || !j["grid"].is_array() ||
      !j["placement"].is_array() || j["grid"].size() != j["placement"].size() ||
      j["grid"].size() < 2) {
    return corrupt("route: router json needs equal-length arrays 'grid' and 'placement' (>= 2)");
  }
  std::vector<double> grid;
  std::vector<Placement> pl;
  const std::size_t k = j["grid"].size();
  for (std::size_t i = 0; i < k; ++i) {
    if (!j["grid"][i].is_number()) return corrupt("route: router json: grid[{}] not a number", i);
    const double g = j["grid"][i].get<double>();
    if (std::fabs(g - static_cast<double>(i) / static_cast<double>(k - 1)) > 1e-9) {
      return corrupt("route: router json: grid must be uniform on [0, 1]; grid[{}] = {}", i, g);
    }
    grid.push_back(g);
    const Json& p = j["placement"][i];
    if (!p.is_string() || (p != "skip" && p != "cond")) {
      return corrupt("route: router json: placement[{}] must be \"skip\" or \"cond\"", i);
    }
    pl.push_back(p == "skip" ? Placement::kSkip : Placement::kCond);
  }
  return Router(std::move(grid), std::move(pl));
}

}  // namespace ferry::route
