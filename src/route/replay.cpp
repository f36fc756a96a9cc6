// SPDX-License-Identifier: Apache-2.0
// Offline replay, tuning and bootstrap (see replay.h).
#include "route/replay.h"

#include <algorithm>
#include <memory>
#include <random>
#include <unordered_map>

#include <fmt/format.h>

#include "route/ap.h"
#include "route/controller.h"

namespace ferry::route {
namespace {

// Scores weak/strong mixes of one split; ranks are taken once per model over the split.
class MaskScorer {
 public:
  explicit MaskScorer(const RecordSet& s) : s_(s), weak_(s.weak), strong_(s.strong) {
    rank_normalize_per_source(weak_);
    rank_normalize_per_source(strong_);
    for (std::size_t i = 0; i < s.frames.size(); ++i) slot_[s.frames[i]] = static_cast<int>(i);
  }
  std::vector<Detection> mix(const std::vector<std::uint8_t>& off) const {
    std::vector<Detection> d;
    for (const auto& x : weak_) {
      if (!off[slot_.at(x.frame)]) d.push_back(x);
    }
    for (const auto& x : strong_) {
      if (off[slot_.at(x.frame)]) d.push_back(x);
    }
    return d;
  }
  Status score(const std::vector<std::uint8_t>& off, ReplayRow& row) const {
    const std::vector<Detection> d = mix(off);
    ApOptions o;
    o.rank_normalize = false;  // already ranked per model over the split
    FERRY_ASSIGN_OR_RETURN(ApReport a, evaluate_ap(s_.gts, d, ApMetric::kPooled11, o));
    FERRY_ASSIGN_OR_RETURN(ApReport c, evaluate_ap(s_.gts, d, ApMetric::kCoco, o));
    FERRY_ASSIGN_OR_RETURN(ApReport c50, evaluate_ap(s_.gts, d, ApMetric::kCoco50, o));
    row.map = a.mean;
    row.map_coco = c.mean;
    row.map_coco50 = c50.mean;
    return ok_status();
  }
  // Percentile bootstrap over frames (resampled with replacement; duplicates get new ids).
  Status bootstrap(const std::vector<std::uint8_t>& off, int b, std::uint64_t seed,
                   ReplayRow& row) const {
    if (b <= 0) return ok_status();
    const std::vector<Detection> d = mix(off);
    const int n = static_cast<int>(s_.frames.size());
    std::unordered_map<int, std::vector<int>> g_of, d_of;
    for (int i = 0; i < static_cast<int>(s_.gts.size()); ++i) g_of[s_.gts[i].frame].push_back(i);
    for (int i = 0; i < static_cast<int>(d.size()); ++i) d_of[d[i].frame].push_back(i);
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> pick(0, n - 1);
    std::vector<double> maps;
    ApOptions o;
    o.rank_normalize = false;
    for (int rep = 0; rep < b; ++rep) {
      std::vector<GroundTruth> bg;
      std::vector<Detection> bd;
      for (int k = 0; k < n; ++k) {
        const int f = s_.frames[pick(rng)];
        for (int i : g_of[f]) bg.push_back(s_.gts[i]), bg.back().frame = k;
        for (int i : d_of[f]) bd.push_back(d[i]), bd.back().frame = k;
      }
      auto r = evaluate_ap(bg, bd, ApMetric::kPooled11, o);
      if (r.ok()) maps.push_back(r->mean);  // a resample without objects is skipped
    }
    if (maps.empty()) return ok_status();
    std::sort(maps.begin(), maps.end());
    const auto at = [&](double q) {
      return maps[std::min(maps.size() - 1, static_cast<std::size_t>(q * maps.size()))];
    };
    row.ci_low = at(0.025);
    row.ci_high = at(0.975);
    return ok_status();
  }

 private:
  const RecordSet& s_;
  std::vector<Detection> weak_, strong_;
  std::unordered_map<int, int> slot_;
};

std::unique_ptr<OffloadController> make_controller(const ReplayOptions& o,
                                                   const std::vector<double>& calib,
                                                   std::size_t frames) {
  if (o.controller == ControllerKind::kPaper) {
    return std::make_unique<EcdfThresholdController>(calib);
  }
  double gain = o.feedback_gain;
  if (gain <= 0) gain = std::clamp(1.0 / (0.01 * static_cast<double>(frames) - 1.0), 0.02, 1.0);
  if (0.01 * static_cast<double>(frames) - 1.0 <= 0) gain = 1.0;
  return std::make_unique<FeedbackController>(calib, gain);
}

Status check_column(const RecordSet& s, const std::string& col) {
  if (!s.scores.count(col))
    return invalid_argument("route: records have no score column '{}'", col);
  return ok_status();
}

Status run_one(const RecordSet& split, const MaskScorer& ms, const std::vector<double>& scores,
               const std::vector<double>& calib, Placement p, double rho, const ReplayOptions& opts,
               ReplayRow& row) {
  auto ctl = make_controller(opts, calib, split.frames.size());
  std::vector<std::uint8_t> off(split.frames.size());
  for (std::size_t i = 0; i < off.size(); ++i) off[i] = ctl->decide(scores[i], rho) ? 1 : 0;
  row.ratio = rho;
  row.placement = p;
  row.realised = ctl->realised_ratio();
  row.latency_ms = opts.cost.latency_ms(p, row.realised);
  row.edge_gflops = opts.cost.edge_gflops(p, row.realised);
  FERRY_TRY(ms.score(off, row));
  return ms.bootstrap(off, opts.bootstrap, opts.seed + static_cast<std::uint64_t>(rho * 1000), row);
}

Result<std::vector<double>> json_doubles(const Json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_array()) return corrupt("route: router json lacks '{}'", key);
  std::vector<double> v;
  for (const Json& x : j[key]) {
    if (!x.is_number()) return corrupt("route: router json: '{}' has a non-number", key);
    v.push_back(x.get<double>());
  }
  return v;
}

}  // namespace

std::string replay_rows_to_csv(const std::vector<ReplayRow>& rows) {
  std::string out =
      "estimator,ratio,mAP,mAP_coco,mAP_coco50,placement,realised_ratio,latency_ms,edge_gflops,"
      "mAP_ci_low,mAP_ci_high\n";
  for (const auto& r : rows) {
    out +=
        fmt::format("{},{:.2f},{:.6f},{:.6f},{:.6f},{},{:.4f},{:.3f},{:.4f},{:.6f},{:.6f}\n",
                    r.estimator, r.ratio, r.map, r.map_coco, r.map_coco50, to_string(r.placement),
                    r.realised, r.latency_ms, r.edge_gflops, r.ci_low, r.ci_high);
  }
  return out;
}

Curve curve_from_rows(const std::vector<ReplayRow>& rows) {
  Curve c;
  for (const auto& r : rows) {
    c.name = r.estimator;
    c.ratio.push_back(r.ratio);
    c.map.push_back(r.map);
    c.map_coco.push_back(r.map_coco);
    c.map_coco50.push_back(r.map_coco50);
  }
  return c;
}

Result<std::vector<ReplayRow>> replay_placement(const RecordSet& split, const std::string& name,
                                                Placement placement, const std::string& column,
                                                const std::vector<double>& calib_scores,
                                                const ReplayOptions& opts) {
  FERRY_TRY(check_column(split, column));
  if (split.frames.empty()) return invalid_argument("route: replay: split has no frames");
  const MaskScorer ms(split);
  std::vector<ReplayRow> rows;
  for (double rho : opts.grid) {
    ReplayRow row;
    row.estimator = name;
    FERRY_TRY(run_one(split, ms, split.scores.at(column), calib_scores, placement, rho, opts, row));
    rows.push_back(row);
  }
  return rows;
}

Result<std::vector<ReplayRow>> replay_router(const RecordSet& split, const TunedRouter& router,
                                             const ReplayOptions& opts) {
  FERRY_TRY(check_column(split, router.skip_column));
  FERRY_TRY(check_column(split, router.cond_column));
  if (split.frames.empty()) return invalid_argument("route: replay: split has no frames");
  const MaskScorer ms(split);
  std::vector<ReplayRow> rows;
  for (double rho : opts.grid) {
    const Placement p = router.table.placement(rho);
    const bool skip = p == Placement::kSkip;
    ReplayRow row;
    row.estimator = "adaptive";
    FERRY_TRY(run_one(split, ms, split.scores.at(skip ? router.skip_column : router.cond_column),
                      skip ? router.skip_calibration : router.cond_calibration, p, rho, opts, row));
    rows.push_back(row);
  }
  return rows;
}

Json TunedRouter::to_json() const {
  Json j = table.to_json();
  j["skip_column"] = skip_column;
  j["cond_column"] = cond_column;
  j["skip_calibration"] = skip_calibration;
  j["cond_calibration"] = cond_calibration;
  return j;
}

Result<TunedRouter> TunedRouter::from_json(const Json& j) {
  TunedRouter t;
  FERRY_ASSIGN_OR_RETURN(t.table, Router::from_json(j));
  if (!j.contains("skip_column") || !j["skip_column"].is_string() || !j.contains("cond_column") ||
      !j["cond_column"].is_string()) {
    return corrupt("route: router json lacks string fields skip_column/cond_column");
  }
  t.skip_column = j["skip_column"].get<std::string>();
  t.cond_column = j["cond_column"].get<std::string>();
  FERRY_ASSIGN_OR_RETURN(t.skip_calibration, json_doubles(j, "skip_calibration"));
  FERRY_ASSIGN_OR_RETURN(t.cond_calibration, json_doubles(j, "cond_calibration"));
  return t;
}

Result<TuneResult> tune_router(const RecordSet& calib, const std::string& skip_column,
                               const std::string& cond_column, const ReplayOptions& opts,
                               double lambda_per_ms) {
  FERRY_TRY(check_column(calib, skip_column));
  FERRY_TRY(check_column(calib, cond_column));
  TuneResult t;
  const auto& sc = calib.scores.at(skip_column);
  const auto& cc = calib.scores.at(cond_column);
  FERRY_ASSIGN_OR_RETURN(t.skip_rows,
                         replay_placement(calib, "skip", Placement::kSkip, skip_column, sc, opts));
  FERRY_ASSIGN_OR_RETURN(t.cond_rows,
                         replay_placement(calib, "cond", Placement::kCond, cond_column, cc, opts));
  const Curve skip = curve_from_rows(t.skip_rows), cond = curve_from_rows(t.cond_rows);
  FERRY_ASSIGN_OR_RETURN(t.envelope, adaptive_envelope(skip, cond));
  t.router = TunedRouter{Router(t.envelope), skip_column, cond_column, sc, cc};
  FERRY_ASSIGN_OR_RETURN(Router ca, cost_aware_router(opts.cost, skip, cond, lambda_per_ms));
  t.cost_router = TunedRouter{std::move(ca), skip_column, cond_column, sc, cc};
  return t;
}

}  // namespace ferry::route
