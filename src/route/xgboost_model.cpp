// SPDX-License-Identifier: Apache-2.0
// XGBoost JSON model loader and tree walker (see xgboost_model.h).
#include "route/xgboost_model.h"

#include <cmath>
#include <cstdlib>

#include "core/file_util.h"
#include "core/json.h"

namespace ferry::route {
namespace {

// XGBoost writes numeric parameters as strings; 3.x writes base_score as "[v]".
Result<double> param_number(const Json& obj, const char* key, std::string_view what) {
  if (!obj.contains(key)) return corrupt("route: xgboost: {}: missing '{}'", what, key);
  const Json& v = obj[key];
  if (v.is_number()) return v.get<double>();
  if (!v.is_string()) return corrupt("route: xgboost: {}: '{}' is not a number", what, key);
  std::string s = v.get<std::string>();
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  if (s.find(',') != std::string::npos) {
    return unimplemented("route: xgboost: {}: vector '{}' (multi-output) not supported", what, key);
  }
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(d)) {
    return corrupt("route: xgboost: {}: '{}' = '{}' is not a finite number", what, key, s);
  }
  return d;
}

template <typename T>
Result<std::vector<T>> array_of(const Json& tree, const char* key, std::size_t n,
                                std::string_view what, int tree_index) {
  if (!tree.contains(key) || !tree[key].is_array() || tree[key].size() != n) {
    return corrupt("route: xgboost: {}: tree {} '{}' missing or not {} long", what, tree_index, key,
                   n);
  }
  std::vector<T> out;
  out.reserve(n);
  for (const Json& v : tree[key]) {
    if (!v.is_number()) {
      return corrupt("route: xgboost: {}: tree {} '{}' holds a non-number", what, tree_index, key);
    }
    out.push_back(v.get<T>());
  }
  return out;
}

}  // namespace

Result<XgbModel> XgbModel::load(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse(text, path);
}

Result<XgbModel> XgbModel::parse(std::string_view json_text, std::string_view what) {
  FERRY_ASSIGN_OR_RETURN(Json doc, parse_json(json_text, what));
  // Accept both the bare model and the {"Config", "Model"} serialisation.
  const Json& root = doc.contains("Model") ? doc["Model"] : doc;
  if (!root.is_object() || !root.contains("learner") || !root["learner"].is_object()) {
    return corrupt("route: xgboost: {}: no 'learner' object", what);
  }
  const Json& learner = root["learner"];
  XgbModel m;
  if (!learner.contains("learner_model_param") || !learner.contains("gradient_booster") ||
      !learner.contains("objective")) {
    return corrupt("route: xgboost: {}: learner lacks model param, booster or objective", what);
  }
  const Json& lmp = learner["learner_model_param"];
  FERRY_ASSIGN_OR_RETURN(double num_feature, param_number(lmp, "num_feature", what));
  FERRY_ASSIGN_OR_RETURN(double base_score, param_number(lmp, "base_score", what));
  if (lmp.contains("num_class")) {
    FERRY_ASSIGN_OR_RETURN(double nc, param_number(lmp, "num_class", what));
    if (nc > 1) return unimplemented("route: xgboost: {}: multi-class model", what);
  }
  if (lmp.contains("num_target")) {
    FERRY_ASSIGN_OR_RETURN(double nt, param_number(lmp, "num_target", what));
    if (nt > 1) return unimplemented("route: xgboost: {}: multi-target model", what);
  }
  if (num_feature < 1 || num_feature > 1e6) {
    return corrupt("route: xgboost: {}: num_feature {} out of range", what, num_feature);
  }
  m.num_features_ = static_cast<int>(num_feature);

  m.objective_ = learner["objective"].value("name", "");
  if (m.objective_ == "reg:squarederror" || m.objective_ == "reg:absoluteerror" ||
      m.objective_ == "reg:pseudohubererror") {
    m.base_score_ = static_cast<float>(base_score);
  } else if (m.objective_ == "reg:logistic" || m.objective_ == "binary:logistic") {
    if (!(base_score > 0 && base_score < 1)) {
      return corrupt("route: xgboost: {}: logistic base_score {} not in (0, 1)", what, base_score);
    }
    m.sigmoid_ = true;
    m.base_score_ = static_cast<float>(std::log(base_score / (1 - base_score)));
  } else {
    return unimplemented("route: xgboost: {}: objective '{}' not supported", what, m.objective_);
  }

  const Json& gb = learner["gradient_booster"];
  if (gb.value("name", "") != "gbtree" || !gb.contains("model") || !gb["model"].contains("trees") ||
      !gb["model"]["trees"].is_array()) {
    return unimplemented("route: xgboost: {}: only gbtree boosters are supported", what);
  }
  const Json& trees = gb["model"]["trees"];
  for (std::size_t t = 0; t < trees.size(); ++t) {
    const Json& tree = trees[t];
    const int ti = static_cast<int>(t);
    if (!tree.is_object() || !tree.contains("tree_param")) {
      return corrupt("route: xgboost: {}: tree {} malformed", what, ti);
    }
    FERRY_ASSIGN_OR_RETURN(double nn, param_number(tree["tree_param"], "num_nodes", what));
    if (tree["tree_param"].contains("size_leaf_vector")) {
      FERRY_ASSIGN_OR_RETURN(double slv,
                             param_number(tree["tree_param"], "size_leaf_vector", what));
      if (slv > 1) return unimplemented("route: xgboost: {}: vector-leaf trees", what);
    }
    if (nn < 1 || nn > 1e7)
      return corrupt("route: xgboost: {}: tree {} has {} nodes", what, ti, nn);
    const auto n = static_cast<std::size_t>(nn);
    FERRY_ASSIGN_OR_RETURN(auto left, array_of<std::int64_t>(tree, "left_children", n, what, ti));
    FERRY_ASSIGN_OR_RETURN(auto right, array_of<std::int64_t>(tree, "right_children", n, what, ti));
    FERRY_ASSIGN_OR_RETURN(auto feat, array_of<std::int64_t>(tree, "split_indices", n, what, ti));
    FERRY_ASSIGN_OR_RETURN(auto cond, array_of<double>(tree, "split_conditions", n, what, ti));
    FERRY_ASSIGN_OR_RETURN(auto dleft, array_of<int>(tree, "default_left", n, what, ti));
    if (tree.contains("split_type")) {
      FERRY_ASSIGN_OR_RETURN(auto st, array_of<int>(tree, "split_type", n, what, ti));
      for (int s : st) {
        if (s != 0) return unimplemented("route: xgboost: {}: categorical splits", what);
      }
    }
    const auto base = static_cast<std::int32_t>(m.nodes_.size());
    for (std::size_t i = 0; i < n; ++i) {
      Node node;
      const bool leaf = left[i] == -1;
      if (!leaf) {
        // Children must point forward inside this tree so the walk always terminates.
        if (left[i] <= static_cast<std::int64_t>(i) || right[i] <= static_cast<std::int64_t>(i) ||
            left[i] >= static_cast<std::int64_t>(n) || right[i] >= static_cast<std::int64_t>(n)) {
          return corrupt("route: xgboost: {}: tree {} node {} has bad children {} {}", what, ti, i,
                         left[i], right[i]);
        }
        if (feat[i] < 0 || feat[i] >= m.num_features_) {
          return corrupt("route: xgboost: {}: tree {} node {} splits on feature {} of {}", what, ti,
                         i, feat[i], m.num_features_);
        }
        node.left = base + static_cast<std::int32_t>(left[i]);
        node.right = base + static_cast<std::int32_t>(right[i]);
        node.feature = static_cast<std::int32_t>(feat[i]);
      }
      if (!std::isfinite(cond[i])) {
        return corrupt("route: xgboost: {}: tree {} node {} has a non-finite value", what, ti, i);
      }
      node.value = static_cast<float>(cond[i]);
      node.default_left = dleft[i] != 0;
      m.nodes_.push_back(node);
    }
    m.roots_.push_back(base);
  }
  if (m.roots_.empty()) return corrupt("route: xgboost: {}: no trees", what);
  return m;
}

float XgbModel::predict_unchecked(const float* x) const {
  float sum = base_score_;
  for (std::int32_t r : roots_) {
    const Node* node = &nodes_[static_cast<std::size_t>(r)];
    while (node->left >= 0) {
      const float v = x[node->feature];
      const bool go_left = std::isnan(v) ? node->default_left : v < node->value;
      node = &nodes_[static_cast<std::size_t>(go_left ? node->left : node->right)];
    }
    sum += node->value;
  }
  return sigmoid_ ? 1.0f / (1.0f + std::exp(-sum)) : sum;
}

Result<float> XgbModel::predict(std::span<const float> x) const {
  if (x.size() != static_cast<std::size_t>(num_features_)) {
    return invalid_argument("route: xgboost: predict: {} features given, model needs {}", x.size(),
                            num_features_);
  }
  return predict_unchecked(x.data());
}

}  // namespace ferry::route
