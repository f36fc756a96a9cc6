// SPDX-License-Identifier: Apache-2.0
// Operating curves (accuracy vs offload budget ρ), their AUC, the budget-adaptive envelope of a
// weak-skipping and a weak-conditioned curve, and the router table ρ -> placement it yields.
// The envelope picks, at each grid ρ, the placement with the higher mAP (ties: conditioned, the
// paper's choice); ρ_frontier is the first grid ρ where skipping wins, ρ_ceiling the first grid ρ
// after it where conditioned wins again. Replaying the artifact's curves reproduces 0.3 / 0.8
// (tests/unit/route/paper_replay_test.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "route/csv.h"

namespace ferry::route {

enum class Placement : std::uint8_t { kCond = 0, kSkip = 1 };
std::string_view to_string(Placement p);

struct Curve {
  std::string name;
  std::vector<double> ratio, map, map_coco, map_coco50;  // [K], ratio ascending
};

// Reads rows `estimator, ratio, mAP, mAP_coco, mAP_coco50` (other columns ignored), one curve per
// estimator, sorted by ratio.
Result<std::map<std::string, Curve>> curves_from_csv(const CsvTable& t);
// Writes the same columns (artifact-compatible CSV).
std::string curves_to_csv(const std::vector<Curve>& curves);

// Trapezoid area under y(x); x ascending. Errors on size mismatch or fewer than 2 points.
Result<double> auc_trapezoid(const std::vector<double>& x, const std::vector<double>& y);

struct Envelope {
  std::vector<double> ratio, map;    // [K]
  std::vector<Placement> choice;     // [K]
  double frontier = 2, ceiling = 2;  // 2 = "never" (skipping never wins / never stops winning)
};
// Both curves must share the same ratio grid.
Result<Envelope> adaptive_envelope(const Curve& skip, const Curve& cond);

// ρ -> placement by table lookup on a uniform grid over [0, 1] (O(1); ρ rounds to the nearest
// grid point). JSON: {"grid": [...], "placement": ["cond"|"skip", ...], "frontier", "ceiling"}.
class Router {
 public:
  Router() = default;
  explicit Router(const Envelope& env);
  Router(std::vector<double> grid, std::vector<Placement> placement);
  Placement placement(double rho) const;
  const std::vector<double>& grid() const { return grid_; }
  const std::vector<Placement>& table() const { return placement_; }
  Json to_json() const;
  static Result<Router> from_json(const Json& j);

 private:
  std::vector<double> grid_;
  std::vector<Placement> placement_;
};

}  // namespace ferry::route
