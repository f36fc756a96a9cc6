// SPDX-License-Identifier: Apache-2.0
// The edge agent's end-of-run summary (see agent.h): latency percentiles, and the AP of the
// detections the agent produced (strong replies for offloaded-ok frames, weak results for the
// rest) next to weak-only and strong-only over the same frames. Scores are rank-normalised per
// source (evaluate_ap's pooled convention), so weak and strong detections can be merged.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_set>

#include "route/agent.h"
#include "route/ap.h"

namespace ferry::route {

LatencyStats latency_stats(std::vector<double> ms) {
  LatencyStats s;
  s.count = static_cast<int>(ms.size());
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  const auto q = [&](double p) {  // nearest rank
    const auto k = static_cast<std::size_t>(std::ceil(p * static_cast<double>(ms.size())));
    return ms[std::min(ms.size() - 1, k == 0 ? 0 : k - 1)];
  };
  s.p50 = q(0.5);
  s.p90 = q(0.9);
  s.p99 = q(0.99);
  s.max = ms.back();
  s.mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
  return s;
}

namespace {

// Pooled 11-point AP@.5 and COCO AP; NaN when the frames hold no scorable ground truth.
std::pair<double, double> score(const std::vector<GroundTruth>& gts,
                                const std::vector<Detection>& dets) {
  ApOptions o;
  o.rank_normalize = true;
  auto a = evaluate_ap(gts, dets, ApMetric::kPooled11, o);
  auto c = evaluate_ap(gts, dets, ApMetric::kCoco, o);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  return {a.ok() ? a->mean : nan, c.ok() ? c->mean : nan};
}

Json stats_json(const LatencyStats& s) {
  return {{"p50", s.p50}, {"p90", s.p90},   {"p99", s.p99},
          {"max", s.max}, {"mean", s.mean}, {"count", s.count}};
}

}  // namespace

Status summarise(const RecordSet& split, int n, const std::vector<std::vector<Detection>>& produced,
                 AgentSummary& s) {
  std::unordered_set<int> used(split.frames.begin(), split.frames.begin() + n);
  std::vector<GroundTruth> gts;
  std::vector<Detection> weak, strong, mix;
  for (const auto& g : split.gts)
    if (used.count(g.frame)) gts.push_back(g);
  for (const auto& d : split.weak)
    if (used.count(d.frame)) weak.push_back(d);
  for (const auto& d : split.strong)
    if (used.count(d.frame)) strong.push_back(d);
  for (const auto& f : produced) mix.insert(mix.end(), f.begin(), f.end());
  std::tie(s.ap_produced, s.coco_produced) = score(gts, mix);
  std::tie(s.ap_weak_only, s.coco_weak_only) = score(gts, weak);
  std::tie(s.ap_strong_only, s.coco_strong_only) = score(gts, strong);
  return ok_status();
}

Json AgentSummary::to_json() const {
  Json reasons = Json::object();
  for (const auto& [k, v] : fallback_reasons) reasons[k] = v;
  return {
      {"frames", frames},
      {"local", local},
      {"offloaded_ok", offloaded_ok},
      {"offloaded_fallback", offloaded_fallback},
      {"accounted", accounted()},
      {"fallback_reasons", reasons},
      {"placement_frames", {{"skip", skip_frames}, {"cond", cond_frames}}},
      {"target_rho", target_rho},
      {"realised_rho", realised_rho},
      {"served_rho", served_rho},
      {"latency_ms", stats_json(latency_ms)},
      {"offload_latency_ms", stats_json(offload_latency_ms)},
      {"ap_metric", "pooled11_ap50 (coco: AP@[.5:.95])"},
      {"ap",
       {{"produced", ap_produced}, {"weak_only", ap_weak_only}, {"strong_only", ap_strong_only}}},
      {"ap_coco",
       {{"produced", coco_produced},
        {"weak_only", coco_weak_only},
        {"strong_only", coco_strong_only}}},
      {"wall_s", wall_s},
      {"frames_per_s", wall_s > 0 ? frames / wall_s : 0.0}};
}

}  // namespace ferry::route
