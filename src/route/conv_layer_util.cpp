// SPDX-License-Identifier: Apache-2.0
// Shared parameter checks and fusions of ferry's OpenCV convolution layers (see conv_layer_util.h).
#include "route/conv_layer_util.h"

#include <algorithm>
#include <iterator>

namespace ferry::route {

bool conv_param_all_equal(const cv::dnn::LayerParams& params, const std::string& key, int want) {
  if (!params.has(key)) return true;
  const cv::dnn::DictValue& v = params.get(key);
  for (int i = 0; i < v.size(); ++i) {
    if (v.get<int>(i) != want) return false;
  }
  return true;
}

bool conv_params_are_plain(const cv::dnn::LayerParams& params, int out_channels) {
  if (params.blobs.empty() || params.blobs.size() > 2) return false;
  if (params.blobs[0].type() != CV_32F) return false;
  if (params.blobs.size() == 2 && (params.blobs[1].type() != CV_32F ||
                                   static_cast<int>(params.blobs[1].total()) != out_channels)) {
    return false;
  }
  static const char* const kAllowed[] = {"kernel_size", "stride", "pad",
                                         "dilation",    "group",  "num_output",
                                         "bias_term",   "depth",  "has_dynamic_shapes"};
  for (auto it = params.begin(); it != params.end(); ++it) {
    if (std::find(std::begin(kAllowed), std::end(kAllowed), it->first) == std::end(kAllowed)) {
      return false;
    }
  }
  return params.get<int>("depth", CV_32F) == CV_32F &&
         params.get<int>("num_output", out_channels) == out_channels;
}

bool fold_clamp_activation(const cv::Ptr<cv::dnn::ActivationLayer>& layer, float& lo, float& hi) {
  if (layer.empty()) return false;
  if (auto relu6 = layer.dynamicCast<cv::dnn::ReLU6Layer>(); !relu6.empty()) {
    lo = std::max(lo, relu6->minValue);
    hi = std::min(hi, relu6->maxValue);
    return true;
  }
  if (auto relu = layer.dynamicCast<cv::dnn::ReLULayer>(); !relu.empty()) {
    if (relu->negativeSlope != 0.0f) return false;
    lo = std::max(lo, 0.0f);
    return true;
  }
  return false;
}

bool per_channel_scale_shift(const cv::Ptr<cv::dnn::Layer>& top, int channels,
                             std::vector<float>& scale, std::vector<float>& shift) {
  cv::Mat s, t;
  top->getScaleShift(s, t);
  if (s.empty() && t.empty()) return false;
  const auto per_channel = [&](const cv::Mat& m) {
    return m.empty() ||
           (m.type() == CV_32F && (static_cast<int>(m.total()) == channels || m.total() == 1));
  };
  if (!per_channel(s) || !per_channel(t)) return false;
  scale.assign(static_cast<std::size_t>(channels), 1.0f);
  shift.assign(static_cast<std::size_t>(channels), 0.0f);
  for (int c = 0; c < channels; ++c) {
    if (!s.empty()) scale[c] = s.ptr<float>()[s.total() == 1 ? 0 : c];
    if (!t.empty()) shift[c] = t.ptr<float>()[t.total() == 1 ? 0 : c];
  }
  return true;
}

}  // namespace ferry::route
