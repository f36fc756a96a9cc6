// SPDX-License-Identifier: Apache-2.0
// The two conditioned baselines of the bgt-ada paper (docs/route_estimators.md).
//
// EdgeML: an MLP [150 -> 64 -> 32 -> 16 -> 1] on edgeml_proposals() (top-25 weak proposals x 6
// features, features.h), standardised by the training StandardScaler, target MORIC. Hidden
// layers are Linear -> BatchNorm1d (eval: running statistics, eps 1e-5) -> ReLU (-> Dropout, the
// identity at inference). Its native decision offloads iff the predicted MORIC > 1 − ρ.
// Weights come from the JSON tools/route/export_skip_estimator.py writes (edgeml_parity.json:
// "state" {name: flat values}, "shapes", "scaler_mean", "scaler_scale").
//
// DCSB (difficult-case small–big): a fixed rule on the weak proposals' count and areas, with the
// artifact's fitted parameters (cond-dcsb-countgain.pkl, a plain dict; DcsbParams defaults).
// The artifact ships parameters, not the rule; ferry's rule, on proposals with confidence
// >= confidence_threshold and areas normalised by the image area:
//   n = their count, a = the smallest normalised area (1 when n = 0)
//   difficult = n >= count_threshold or a < area_threshold
//   score = [difficult] + 0.5·min(n / count_scale, 1) + 0.5·(1 − min(a / area_scale, 1))
// so every difficult frame outranks every easy one, and within a class more and smaller objects
// rank higher (the continuous part lets a budget controller pick among difficult frames).
// Covered by tests/unit/route/baselines_test.cpp.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "route/detection.h"

namespace ferry::route {

class EdgeMlModel {
 public:
  static Result<EdgeMlModel> load(const std::string& path);
  static Result<EdgeMlModel> parse(std::string_view json_text, std::string_view what);

  int input_dim() const { return input_dim_; }
  // x: [input_dim()] raw (unstandardised) proposal features. kInvalidArgument on size mismatch
  // or a non-finite value.
  Result<double> predict(std::span<const float> x) const;
  // EdgeML's native threshold: offload iff score > 1 − ρ.
  static bool offload(double score, double rho) { return score > 1.0 - rho; }

 private:
  struct Layer {
    int in = 0, out = 0;
    std::vector<double> w, b;                // [out * in], [out]
    std::vector<double> bn_scale, bn_shift;  // folded BatchNorm [out]; empty for the last layer
  };
  std::vector<Layer> layers_;
  std::vector<double> mean_, scale_;
  int input_dim_ = 0;
};

struct DcsbParams {
  int proposal_stride = 6, confidence_offset = 0, area_offset = 5;  // layout notes only
  double confidence_threshold = 0.0780825058188964;
  double count_threshold = 3.0;
  double area_threshold = 0.00665463837573216;
  double count_scale = 17.88254647143457;
  double area_scale = 0.1875190791383996;
};

struct DcsbResult {
  bool difficult = false;
  double score = 0;
};

// dets: one frame's weak proposals; image size in pixels (> 0). kInvalidArgument on bad input.
Result<DcsbResult> dcsb_score(const std::vector<Detection>& dets, double image_width,
                              double image_height, const DcsbParams& p = {});

}  // namespace ferry::route
