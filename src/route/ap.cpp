// SPDX-License-Identifier: Apache-2.0
// AP metrics (see ap.h for the conventions). Matching is per frame; the ranked list is then scored
// by ap_sorted(), which every metric (and ORIC's incremental path) shares, so two paths that build
// the same ranked list get bit-identical APs.
#include "route/ap.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <numeric>
#include <set>

#include "core/check.h"

namespace ferry::route {

void sort_ranked(std::vector<RankedItem>& items) {
  std::sort(items.begin(), items.end(),
            [](const RankedItem& a, const RankedItem& b) { return a.score > b.score; });
}

double ap_sorted(std::span<const RankedItem> items, int npos, ApInterp interp) {
  FERRY_CHECK(npos > 0, "ap_sorted: npos={} must be positive", npos);
  const std::size_t n = items.size();
  if (interp == ApInterp::kAllPoint) {
    // Backward pass: env = max precision at this or any later tie-group end; each group adds
    // (recall gained in the group) * env.
    std::int64_t tp_total = 0;
    for (const RankedItem& it : items) tp_total += it.tp;
    FERRY_CHECK(tp_total <= npos, "ap_sorted: {} true positives for {} objects", tp_total, npos);
    double env = 0, ap = 0;
    std::int64_t tp_end = tp_total;
    std::size_t end = n;
    while (end > 0) {
      std::size_t begin = end - 1;
      std::int64_t group_tp = items[begin].tp;
      while (begin > 0 && items[begin - 1].score == items[end - 1].score) {
        --begin;
        group_tp += items[begin].tp;
      }
      env = std::max(env, static_cast<double>(tp_end) / static_cast<double>(end));
      ap += static_cast<double>(group_tp) / npos * env;
      tp_end -= group_tp;
      end = begin;
    }
    return ap;
  }
  // k-point: best[k] = max precision at a group end whose recall bucket is exactly k; a suffix
  // max then gives "max precision at recall >= k/K" for every k.
  const std::int64_t buckets = interp == ApInterp::k11Point ? 10 : 100;
  std::array<double, 101> best{};
  std::int64_t tp = 0;
  std::size_t i = 0;
  while (i < n) {
    std::size_t j = i;
    do {
      tp += items[j].tp;
      ++j;
    } while (j < n && items[j].score == items[i].score);
    const std::int64_t k = tp * buckets / npos;
    FERRY_CHECK(k <= buckets, "ap_sorted: {} true positives for {} objects", tp, npos);
    best[k] = std::max(best[k], static_cast<double>(tp) / static_cast<double>(j));
    i = j;
  }
  double sum = 0, run = 0;
  for (std::int64_t k = buckets; k >= 0; --k) {
    run = std::max(run, best[k]);
    sum += run;
  }
  return sum / static_cast<double>(buckets + 1);
}

namespace {

bool compatible(const ClassMap* m, std::string_view det_cls, std::string_view gt_cls) {
  return m != nullptr ? m->compatible(det_cls, gt_cls) : det_cls == gt_cls;
}

struct FrameSets {
  std::vector<int> gts, dets;
};

std::map<int, FrameSets> group_by_frame(const std::vector<GroundTruth>& gts,
                                        const std::vector<Detection>& dets) {
  std::map<int, FrameSets> frames;
  for (int i = 0; i < static_cast<int>(gts.size()); ++i) frames[gts[i].frame].gts.push_back(i);
  for (int i = 0; i < static_cast<int>(dets.size()); ++i) frames[dets[i].frame].dets.push_back(i);
  return frames;
}

// Greedy matching within one frame. det_idx must be sorted by descending score. Writes one flag
// per entry of det_idx into flags (same order).
void match_frame(const std::vector<GroundTruth>& gts, std::span<const int> gt_idx,
                 const std::vector<Detection>& dets, std::span<const int> det_idx,
                 const MatchOptions& o, std::vector<MatchFlag>& flags) {
  flags.assign(det_idx.size(), MatchFlag::kFp);
  std::vector<char> used(gt_idx.size(), 0);
  for (std::size_t a = 0; a < det_idx.size(); ++a) {
    const Detection& d = dets[det_idx[a]];
    int best = -1;
    double best_iou = -1;
    for (std::size_t b = 0; b < gt_idx.size(); ++b) {
      const GroundTruth& g = gts[gt_idx[b]];
      if (!compatible(o.class_map, d.cls, g.cls)) continue;
      if (o.rule == MatchRule::kCoco && used[b]) continue;
      const double v = iou(d.box, g.box);
      if (v > best_iou) {
        best_iou = v;
        best = static_cast<int>(b);
      }
    }
    if (best < 0 || best_iou < o.iou_threshold) continue;  // false positive
    if (gts[gt_idx[best]].difficult) {
      flags[a] = MatchFlag::kIgnore;
    } else if (!used[best]) {
      used[best] = 1;
      flags[a] = MatchFlag::kTp;
    }  // else: a duplicate on an already-matched object (VOC rule) stays a false positive
  }
}

void sort_by_score(const std::vector<Detection>& dets, std::vector<int>& idx) {
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int a, int b) { return dets[a].score > dets[b].score; });
}

int count_positives(const std::vector<GroundTruth>& gts, const std::string* cls) {
  int n = 0;
  for (const GroundTruth& g : gts) n += (!g.difficult && (cls == nullptr || g.cls == *cls));
  return n;
}

// Per-class AP at one IoU threshold under `rule`; max_dets < 0 keeps all detections.
double class_ap(const std::vector<GroundTruth>& gts, const std::vector<Detection>& dets,
                const std::map<int, FrameSets>& frames, const std::string& cls,
                const MatchOptions& o, int max_dets, ApInterp interp, int npos) {
  std::vector<RankedItem> items;
  std::vector<MatchFlag> flags;
  std::vector<int> g_idx, d_idx;
  for (const auto& [frame, fs] : frames) {
    g_idx.clear();
    d_idx.clear();
    for (int g : fs.gts) {
      if (gts[g].cls == cls) g_idx.push_back(g);
    }
    for (int d : fs.dets) {
      if (compatible(o.class_map, dets[d].cls, cls)) d_idx.push_back(d);
    }
    sort_by_score(dets, d_idx);
    if (max_dets >= 0 && static_cast<int>(d_idx.size()) > max_dets) d_idx.resize(max_dets);
    match_frame(gts, g_idx, dets, d_idx, o, flags);
    for (std::size_t a = 0; a < d_idx.size(); ++a) {
      if (flags[a] == MatchFlag::kIgnore) continue;
      items.push_back(
          {dets[d_idx[a]].score, static_cast<std::uint8_t>(flags[a] == MatchFlag::kTp)});
    }
  }
  sort_ranked(items);
  return ap_sorted(items, npos, interp);
}

}  // namespace

std::vector<MatchFlag> match_pooled(const std::vector<GroundTruth>& gts,
                                    const std::vector<Detection>& dets, const MatchOptions& opts) {
  std::vector<MatchFlag> out(dets.size(), MatchFlag::kFp);
  std::vector<MatchFlag> flags;
  for (auto& [frame, fs] : group_by_frame(gts, dets)) {
    std::vector<int> d_idx = fs.dets;
    sort_by_score(dets, d_idx);
    match_frame(gts, fs.gts, dets, d_idx, opts, flags);
    for (std::size_t a = 0; a < d_idx.size(); ++a) out[d_idx[a]] = flags[a];
  }
  return out;
}

std::vector<double> rank_normalize(std::span<const double> scores) {
  const std::size_t n = scores.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return scores[a] < scores[b]; });
  std::vector<double> out(n);
  std::size_t i = 0;
  while (i < n) {
    std::size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    // #{< s} = i, #{<= s} = j.
    const double u = static_cast<double>(i + j) / (2.0 * static_cast<double>(n));
    for (std::size_t k = i; k < j; ++k) out[order[k]] = u;
    i = j;
  }
  return out;
}

void rank_normalize_per_source(std::vector<Detection>& dets) {
  for (Source src : {Source::kWeak, Source::kStrong}) {
    std::vector<std::size_t> idx;
    std::vector<double> s;
    for (std::size_t i = 0; i < dets.size(); ++i) {
      if (dets[i].source == src) {
        idx.push_back(i);
        s.push_back(dets[i].score);
      }
    }
    const std::vector<double> r = rank_normalize(s);
    for (std::size_t k = 0; k < idx.size(); ++k) dets[idx[k]].score = r[k];
  }
}

Result<ApMetric> parse_ap_metric(std::string_view name) {
  if (name == "voc07") return ApMetric::kVoc07;
  if (name == "voc12") return ApMetric::kVoc12;
  if (name == "coco") return ApMetric::kCoco;
  if (name == "coco50") return ApMetric::kCoco50;
  if (name == "pooled11") return ApMetric::kPooled11;
  return invalid_argument("route: unknown AP metric '{}' (voc07, voc12, coco, coco50, pooled11)",
                          name);
}

std::string_view to_string(ApMetric m) {
  switch (m) {
    case ApMetric::kVoc07:
      return "voc07";
    case ApMetric::kVoc12:
      return "voc12";
    case ApMetric::kCoco:
      return "coco";
    case ApMetric::kCoco50:
      return "coco50";
    case ApMetric::kPooled11:
      return "pooled11";
  }
  return "unknown";
}

Result<ApReport> evaluate_ap(const std::vector<GroundTruth>& gts,
                             const std::vector<Detection>& dets, ApMetric metric,
                             const ApOptions& opts) {
  ApReport rep;
  rep.metric = metric;
  rep.num_gt = count_positives(gts, nullptr);
  rep.num_det = static_cast<int>(dets.size());
  if (rep.num_gt == 0) {
    return invalid_argument("route: ap: no (non-difficult) ground-truth objects to score against");
  }
  if (!(opts.iou_threshold > 0 && opts.iou_threshold <= 1)) {
    return invalid_argument("route: ap: iou threshold {} outside (0, 1]", opts.iou_threshold);
  }
  if (metric == ApMetric::kPooled11) {
    std::vector<Detection> d = dets;
    if (opts.rank_normalize) rank_normalize_per_source(d);
    const MatchOptions mo{opts.iou_threshold, MatchRule::kVoc, opts.class_map};
    const std::vector<MatchFlag> flags = match_pooled(gts, d, mo);
    std::vector<RankedItem> items;
    items.reserve(d.size());
    for (std::size_t i = 0; i < d.size(); ++i) {
      if (flags[i] == MatchFlag::kIgnore) continue;
      items.push_back({d[i].score, static_cast<std::uint8_t>(flags[i] == MatchFlag::kTp)});
    }
    sort_ranked(items);
    rep.mean = ap_sorted(items, rep.num_gt, ApInterp::k11Point);
    return rep;
  }

  const auto frames = group_by_frame(gts, dets);
  std::set<std::string> classes;
  for (const GroundTruth& g : gts) classes.insert(g.cls);
  double sum = 0;
  for (const std::string& cls : classes) {
    const int npos = count_positives(gts, &cls);
    if (npos == 0) continue;  // only difficult objects: AP undefined, left out of the mean
    double ap = 0;
    if (metric == ApMetric::kVoc07 || metric == ApMetric::kVoc12) {
      const MatchOptions mo{opts.iou_threshold, MatchRule::kVoc, opts.class_map};
      ap = class_ap(gts, dets, frames, cls, mo, -1,
                    metric == ApMetric::kVoc07 ? ApInterp::k11Point : ApInterp::kAllPoint, npos);
    } else {
      const int steps = metric == ApMetric::kCoco ? 10 : 1;
      for (int t = 0; t < steps; ++t) {
        const MatchOptions mo{0.5 + 0.05 * t, MatchRule::kCoco, opts.class_map};
        ap += class_ap(gts, dets, frames, cls, mo, opts.coco_max_dets, ApInterp::k101Point, npos);
      }
      ap /= steps;
    }
    rep.per_class.emplace_back(cls, ap);
    sum += ap;
  }
  rep.mean = sum / static_cast<double>(rep.per_class.size());
  return rep;
}

}  // namespace ferry::route
