// SPDX-License-Identifier: Apache-2.0
// EdgeML MLP and DCSB rule baselines (see baselines.h).
#include "route/baselines.h"

#include <algorithm>
#include <cmath>

#include "core/file_util.h"
#include "core/json.h"

namespace ferry::route {
namespace {

Result<std::vector<double>> numbers(const Json& obj, const std::string& key, std::size_t n,
                                    std::string_view what) {
  if (!obj.contains(key) || !obj[key].is_array() || obj[key].size() != n) {
    return corrupt("route: edgeml: {}: '{}' missing or not {} long", what, key, n);
  }
  std::vector<double> out;
  out.reserve(n);
  for (const Json& v : obj[key]) {
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      return corrupt("route: edgeml: {}: '{}' holds a non-finite value", what, key);
    }
    out.push_back(v.get<double>());
  }
  return out;
}

}  // namespace

Result<EdgeMlModel> EdgeMlModel::load(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse(text, path);
}

Result<EdgeMlModel> EdgeMlModel::parse(std::string_view json_text, std::string_view what) {
  FERRY_ASSIGN_OR_RETURN(Json doc, parse_json(json_text, what));
  if (!doc.is_object() || !doc.contains("state") || !doc["state"].is_object() ||
      !doc.contains("shapes") || !doc["shapes"].is_object()) {
    return corrupt("route: edgeml: {}: no 'state'/'shapes' objects", what);
  }
  const Json& state = doc["state"];
  const Json& shapes = doc["shapes"];
  EdgeMlModel m;
  constexpr double kEps = 1e-5;
  for (int i = 0;; ++i) {
    const std::string pre = "stacks." + std::to_string(i) + ".";
    if (!shapes.contains(pre + "0.weight")) break;
    const Json& shp = shapes[pre + "0.weight"];
    if (!shp.is_array() || shp.size() != 2 || !shp[0].is_number_integer() ||
        !shp[1].is_number_integer() || shp[0].get<int>() <= 0 || shp[1].get<int>() <= 0) {
      return corrupt("route: edgeml: {}: bad shape for {}0.weight", what, pre);
    }
    Layer l;
    l.out = shp[0].get<int>();
    l.in = shp[1].get<int>();
    if (!m.layers_.empty() && m.layers_.back().out != l.in) {
      return corrupt("route: edgeml: {}: layer {} takes {} inputs, previous gives {}", what, i,
                     l.in, m.layers_.back().out);
    }
    const auto out = static_cast<std::size_t>(l.out);
    FERRY_ASSIGN_OR_RETURN(l.w, numbers(state, pre + "0.weight", out * l.in, what));
    FERRY_ASSIGN_OR_RETURN(l.b, numbers(state, pre + "0.bias", out, what));
    if (state.contains(pre + "1.weight")) {
      FERRY_ASSIGN_OR_RETURN(auto g, numbers(state, pre + "1.weight", out, what));
      FERRY_ASSIGN_OR_RETURN(auto beta, numbers(state, pre + "1.bias", out, what));
      FERRY_ASSIGN_OR_RETURN(auto rm, numbers(state, pre + "1.running_mean", out, what));
      FERRY_ASSIGN_OR_RETURN(auto rv, numbers(state, pre + "1.running_var", out, what));
      for (std::size_t k = 0; k < out; ++k) {
        if (rv[k] < 0) return corrupt("route: edgeml: {}: negative running_var", what);
        const double s = g[k] / std::sqrt(rv[k] + kEps);
        l.bn_scale.push_back(s);
        l.bn_shift.push_back(beta[k] - rm[k] * s);
      }
    }
    m.layers_.push_back(std::move(l));
  }
  if (m.layers_.empty() || m.layers_.back().out != 1 || !m.layers_.back().bn_scale.empty()) {
    return corrupt("route: edgeml: {}: need stacks ending in a plain Linear(., 1)", what);
  }
  m.input_dim_ = m.layers_.front().in;
  const auto n = static_cast<std::size_t>(m.input_dim_);
  FERRY_ASSIGN_OR_RETURN(m.mean_, numbers(doc, "scaler_mean", n, what));
  FERRY_ASSIGN_OR_RETURN(m.scale_, numbers(doc, "scaler_scale", n, what));
  for (double s : m.scale_) {
    if (!(s > 0)) return corrupt("route: edgeml: {}: non-positive scaler scale", what);
  }
  return m;
}

Result<double> EdgeMlModel::predict(std::span<const float> x) const {
  if (x.size() != static_cast<std::size_t>(input_dim_)) {
    return invalid_argument("route: edgeml: {} inputs given, model needs {}", x.size(), input_dim_);
  }
  std::vector<double> h(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return invalid_argument("route: edgeml: input {} not finite", i);
    h[i] = (x[i] - mean_[i]) / scale_[i];
  }
  std::vector<double> next;
  for (const Layer& l : layers_) {
    next.assign(static_cast<std::size_t>(l.out), 0.0);
    for (int o = 0; o < l.out; ++o) {
      double acc = l.b[static_cast<std::size_t>(o)];
      const double* w = l.w.data() + static_cast<std::size_t>(o) * l.in;
      for (int i = 0; i < l.in; ++i) acc += w[i] * h[static_cast<std::size_t>(i)];
      if (!l.bn_scale.empty()) {
        acc =
            acc * l.bn_scale[static_cast<std::size_t>(o)] + l.bn_shift[static_cast<std::size_t>(o)];
        acc = std::max(acc, 0.0);  // ReLU
      }
      next[static_cast<std::size_t>(o)] = acc;
    }
    h.swap(next);
  }
  return h[0];
}

Result<DcsbResult> dcsb_score(const std::vector<Detection>& dets, double image_width,
                              double image_height, const DcsbParams& p) {
  if (!(image_width > 0) || !(image_height > 0) || !std::isfinite(image_width) ||
      !std::isfinite(image_height)) {
    return invalid_argument("route: dcsb: bad image size {}x{}", image_width, image_height);
  }
  if (!(p.count_scale > 0) || !(p.area_scale > 0)) {
    return invalid_argument("route: dcsb: count_scale and area_scale must be > 0");
  }
  int n = 0;
  double min_area = 1.0;
  for (const Detection& d : dets) {
    if (!std::isfinite(d.score) || !std::isfinite(d.box.width) || !std::isfinite(d.box.height) ||
        d.box.width < 0 || d.box.height < 0) {
      return invalid_argument("route: dcsb: detection on frame {} has a bad score or size",
                              d.frame);
    }
    if (d.score < p.confidence_threshold) continue;
    ++n;
    min_area = std::min(min_area, d.box.width * d.box.height / (image_width * image_height));
  }
  DcsbResult r;
  r.difficult = n >= p.count_threshold || min_area < p.area_threshold;
  r.score = (r.difficult ? 1.0 : 0.0) + 0.5 * std::min(n / p.count_scale, 1.0) +
            0.5 * (1.0 - std::min(min_area / p.area_scale, 1.0));
  return r;
}

}  // namespace ferry::route
