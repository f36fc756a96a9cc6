// SPDX-License-Identifier: Apache-2.0
// Weak-detection features for the conditioned estimators; definitions in features.h.
#include "route/features.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ferry::route {
namespace {

struct Moments {
  double mean = 0, std = 0;
};

Moments moments(const std::vector<double>& v) {
  Moments m;
  if (v.empty()) return m;
  const double n = static_cast<double>(v.size());
  m.mean = std::accumulate(v.begin(), v.end(), 0.0) / n;
  double ss = 0;
  for (double x : v) ss += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(ss / n);  // population std (ddof = 0)
  return m;
}

double pearson(const std::vector<double>& a, const std::vector<double>& b) {
  const Moments ma = moments(a), mb = moments(b);
  if (a.size() < 2 || ma.std == 0 || mb.std == 0) return 0;
  double cov = 0;
  for (std::size_t i = 0; i < a.size(); ++i) cov += (a[i] - ma.mean) * (b[i] - mb.mean);
  cov /= static_cast<double>(a.size());
  return cov / (ma.std * mb.std);
}

Status check_detection(const Detection& d, std::size_t index) {
  const Box& b = d.box;
  if (!std::isfinite(d.score) || !std::isfinite(b.left) || !std::isfinite(b.top) ||
      !std::isfinite(b.width) || !std::isfinite(b.height)) {
    return invalid_argument("route: features: detection {} (frame {}) has a non-finite value",
                            index, d.frame);
  }
  if (b.width < 0 || b.height < 0) {
    return invalid_argument("route: features: detection {} (frame {}) has negative size {}x{}",
                            index, d.frame, b.width, b.height);
  }
  return ok_status();
}

}  // namespace

const std::array<std::string_view, kNumCondFeatures>& cond_feature_names() {
  static const std::array<std::string_view, kNumCondFeatures> kNames = {
      "count",      "conf_mean", "conf_std",      "conf_min", "conf_max", "conf_median",
      "conf_q25",   "conf_q75",  "area_mean",     "area_std", "area_min", "area_max",
      "area_total", "cx_mean",   "cx_std",        "cy_mean",  "cy_std",   "aspect_mean",
      "aspect_std", "area_cv",   "conf_area_corr"};
  return kNames;
}

double sorted_quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

Result<CondFeatures> cond_features(const std::vector<Detection>& dets, double min_confidence) {
  std::vector<double> conf, area, cx, cy, aspect;
  for (std::size_t i = 0; i < dets.size(); ++i) {
    FERRY_TRY(check_detection(dets[i], i));
    const Detection& d = dets[i];
    if (d.score < min_confidence) continue;
    conf.push_back(d.score);
    area.push_back(d.box.width * d.box.height);
    cx.push_back(d.box.left + d.box.width / 2);
    cy.push_back(d.box.top + d.box.height / 2);
    aspect.push_back(d.box.height > 0 ? d.box.width / d.box.height : 0.0);
  }
  CondFeatures f{};
  if (conf.empty()) return f;  // all zeros

  std::vector<double> sorted = conf;
  std::sort(sorted.begin(), sorted.end());
  const Moments mc = moments(conf), ma = moments(area), mx = moments(cx), my = moments(cy),
                mr = moments(aspect);
  f[0] = static_cast<double>(conf.size());
  f[1] = mc.mean;
  f[2] = mc.std;
  f[3] = sorted.front();
  f[4] = sorted.back();
  f[5] = sorted_quantile(sorted, 0.5);
  f[6] = sorted_quantile(sorted, 0.25);
  f[7] = sorted_quantile(sorted, 0.75);
  f[8] = ma.mean;
  f[9] = ma.std;
  f[10] = *std::min_element(area.begin(), area.end());
  f[11] = *std::max_element(area.begin(), area.end());
  f[12] = std::accumulate(area.begin(), area.end(), 0.0);
  f[13] = mx.mean;
  f[14] = mx.std;
  f[15] = my.mean;
  f[16] = my.std;
  f[17] = mr.mean;
  f[18] = mr.std;
  f[19] = ma.mean > 0 ? ma.std / ma.mean : 0.0;
  f[20] = pearson(conf, area);
  return f;
}

Result<std::vector<float>> edgeml_proposals(const std::vector<Detection>& dets, double image_width,
                                            double image_height, int k) {
  if (!(image_width > 0) || !(image_height > 0) || !std::isfinite(image_width) ||
      !std::isfinite(image_height) || k <= 0) {
    return invalid_argument("route: edgeml: bad image size {}x{} or k {}", image_width,
                            image_height, k);
  }
  std::vector<std::size_t> order(dets.size());
  for (std::size_t i = 0; i < dets.size(); ++i) {
    FERRY_TRY(check_detection(dets[i], i));
    order[i] = i;
  }
  // Highest confidence first; ties keep input order so the result is deterministic.
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return dets[a].score > dets[b].score; });
  std::vector<float> out(static_cast<std::size_t>(k) * kEdgeMlStride, 0.0f);
  const std::size_t n = std::min(order.size(), static_cast<std::size_t>(k));
  for (std::size_t s = 0; s < n; ++s) {
    const Box& b = dets[order[s]].box;
    float* p = out.data() + s * kEdgeMlStride;
    p[0] = static_cast<float>(dets[order[s]].score);
    p[1] = static_cast<float>((b.left + b.width / 2) / image_width);
    p[2] = static_cast<float>((b.top + b.height / 2) / image_height);
    p[3] = static_cast<float>(b.width / image_width);
    p[4] = static_cast<float>(b.height / image_height);
    p[5] = static_cast<float>(b.width * b.height / (image_width * image_height));
  }
  return out;
}

}  // namespace ferry::route
