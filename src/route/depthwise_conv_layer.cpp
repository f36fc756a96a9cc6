// SPDX-License-Identifier: Apache-2.0
// OpenCV DNN layer around the depthwise 3x3 kernel (see depthwise_conv_layer.h).
#include "route/depthwise_conv_layer.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <opencv2/dnn.hpp>
#include <opencv2/dnn/all_layers.hpp>

#include "route/depthwise_conv.h"

namespace ferry::route {
namespace {

std::mutex& scope_mutex() {
  static std::mutex m;
  return m;
}
int g_depthwise_layers = 0;  // guarded by scope_mutex()

// True if every entry of params[key] (when present) equals `want`.
bool all_equal(const cv::dnn::LayerParams& params, const std::string& key, int want) {
  if (!params.has(key)) return true;
  const cv::dnn::DictValue& v = params.get(key);
  for (int i = 0; i < v.size(); ++i) {
    if (v.get<int>(i) != want) return false;
  }
  return true;
}

// The stride (1 or 2) if `params` describe a convolution our kernel handles; nullopt otherwise.
std::optional<int> depthwise_stride(const cv::dnn::LayerParams& params) {
  if (params.blobs.empty() || params.blobs.size() > 2) return std::nullopt;
  const cv::Mat& w = params.blobs[0];  // [C, 1, 3, 3]
  if (w.dims != 4 || w.type() != CV_32F || w.size[1] != 1 || w.size[2] != 3 || w.size[3] != 3) {
    return std::nullopt;
  }
  const int c = w.size[0];
  if (params.get<int>("group", 1) != c || params.get<int>("num_output", c) != c) {
    return std::nullopt;
  }
  if (params.blobs.size() == 2 &&
      (params.blobs[1].type() != CV_32F || static_cast<int>(params.blobs[1].total()) != c)) {
    return std::nullopt;
  }
  // Only the plain keys the ONNX importer writes; anything else (per-side pads, auto_pad,
  // ceil_mode, ...) goes to OpenCV.
  static const char* const kAllowed[] = {"kernel_size", "stride", "pad",
                                         "dilation",    "group",  "num_output",
                                         "bias_term",   "depth",  "has_dynamic_shapes"};
  for (auto it = params.begin(); it != params.end(); ++it) {
    if (std::find(std::begin(kAllowed), std::end(kAllowed), it->first) == std::end(kAllowed)) {
      return std::nullopt;
    }
  }
  if (params.get<int>("depth", CV_32F) != CV_32F) return std::nullopt;
  if (!all_equal(params, "kernel_size", 3) || !all_equal(params, "pad", 1) ||
      !all_equal(params, "dilation", 1) || !params.has("pad")) {
    return std::nullopt;
  }
  if (all_equal(params, "stride", 1)) return 1;
  if (all_equal(params, "stride", 2)) return 2;
  return std::nullopt;
}

class DepthwiseConv3x3Layer final : public cv::dnn::Layer {
 public:
  DepthwiseConv3x3Layer(const cv::dnn::LayerParams& params, int stride)
      : cv::dnn::Layer(params), stride_(stride) {
    const cv::Mat& w = params.blobs[0];
    channels_ = w.size[0];
    weight_.assign(w.ptr<float>(), w.ptr<float>() + static_cast<std::size_t>(channels_) * 9);
    bias_.assign(static_cast<std::size_t>(channels_), 0.0f);
    if (params.blobs.size() == 2) {
      const float* b = params.blobs[1].ptr<float>();
      std::copy(b, b + channels_, bias_.begin());
    }
  }

  bool supportBackend(int backend_id) override { return backend_id == cv::dnn::DNN_BACKEND_OPENCV; }

  bool getMemoryShapes(const std::vector<cv::dnn::MatShape>& inputs, int /*required_outputs*/,
                       std::vector<cv::dnn::MatShape>& outputs,
                       std::vector<cv::dnn::MatShape>& /*internals*/) const override {
    CV_Assert(inputs.size() == 1 && inputs[0].size() == 4 && inputs[0][1] == channels_);
    const cv::dnn::MatShape& in = inputs[0];  // [N, C, H, W]
    outputs.assign(1, {in[0], in[1], depthwise_conv3x3_out_size(in[2], stride_),
                       depthwise_conv3x3_out_size(in[3], stride_)});
    return false;
  }

  void finalize(cv::InputArrayOfArrays inputs_arr, cv::OutputArrayOfArrays /*outputs*/) override {
    std::vector<cv::Mat> inputs;
    inputs_arr.getMatVector(inputs);
    CV_Assert(inputs.size() == 1 && inputs[0].dims == 4);
    scratch_.resize(depthwise_conv3x3_scratch_floats(inputs[0].size[2], inputs[0].size[3]));
  }

  void forward(cv::InputArrayOfArrays inputs_arr, cv::OutputArrayOfArrays outputs_arr,
               cv::OutputArrayOfArrays /*internals*/) override {
    std::vector<cv::Mat> inputs, outputs;
    inputs_arr.getMatVector(inputs);
    outputs_arr.getMatVector(outputs);
    const cv::Mat& in = inputs[0];  // [N, C, H, W]
    cv::Mat& out = outputs[0];      // [N, C, Ho, Wo]
    CV_Assert(in.type() == CV_32F && in.isContinuous() && out.isContinuous());
    const int n = in.size[0], h = in.size[2], w = in.size[3];
    // Shapes can change between finalize calls only through finalize; guard anyway.
    CV_Assert(scratch_.size() >= depthwise_conv3x3_scratch_floats(h, w));
    DepthwiseConv3x3Args a;
    a.weight = weight_.data();
    a.bias = bias_.data();
    a.scratch = scratch_.data();
    a.channels = channels_;
    a.height = h;
    a.width = w;
    a.stride = stride_;
    a.clamp_min = clamp_min_;
    a.clamp_max = clamp_max_;
    for (int i = 0; i < n; ++i) {
      a.in = in.ptr<float>(i);
      a.out = out.ptr<float>(i);
      depthwise_conv3x3(a);
    }
  }

  // ReLU (slope 0) and ReLU6-style clamps become the kernel's clamp; others stay separate layers.
  bool setActivation(const cv::Ptr<cv::dnn::ActivationLayer>& layer) override {
    if (layer.empty()) return false;
    if (auto relu6 = layer.dynamicCast<cv::dnn::ReLU6Layer>(); !relu6.empty()) {
      clamp_min_ = std::max(clamp_min_, relu6->minValue);
      clamp_max_ = std::min(clamp_max_, relu6->maxValue);
      return true;
    }
    if (auto relu = layer.dynamicCast<cv::dnn::ReLULayer>(); !relu.empty()) {
      if (relu->negativeSlope != 0.0f) return false;
      clamp_min_ = std::max(clamp_min_, 0.0f);
      return true;
    }
    return false;
  }

  // A following per-channel scale/shift (BatchNorm, Scale) folds into weights and bias, unless an
  // activation is already fused (it would then apply before the scale).
  bool tryFuse(cv::Ptr<cv::dnn::Layer>& top) override {
    if (clamp_min_ != kNoClamp || clamp_max_ != -kNoClamp) return false;
    cv::Mat scale, shift;
    top->getScaleShift(scale, shift);
    if (scale.empty() && shift.empty()) return false;
    const auto per_channel = [&](const cv::Mat& m) {
      return m.empty() ||
             (m.type() == CV_32F && (static_cast<int>(m.total()) == channels_ || m.total() == 1));
    };
    if (!per_channel(scale) || !per_channel(shift)) return false;
    for (int c = 0; c < channels_; ++c) {
      const float s = scale.empty() ? 1.0f : scale.ptr<float>()[scale.total() == 1 ? 0 : c];
      const float t = shift.empty() ? 0.0f : shift.ptr<float>()[shift.total() == 1 ? 0 : c];
      for (int k = 0; k < 9; ++k) weight_[static_cast<std::size_t>(c) * 9 + k] *= s;
      bias_[static_cast<std::size_t>(c)] = bias_[static_cast<std::size_t>(c)] * s + t;
    }
    return true;
  }

 private:
  static constexpr float kNoClamp = -std::numeric_limits<float>::infinity();
  int stride_ = 1;
  int channels_ = 0;
  std::vector<float> weight_;   // [C, 3, 3]; BatchNorm/Scale folded in by tryFuse
  std::vector<float> bias_;     // [C]
  std::vector<float> scratch_;  // padded plane, sized in finalize (forward never allocates)
  float clamp_min_ = kNoClamp;
  float clamp_max_ = -kNoClamp;
};

cv::Ptr<cv::dnn::Layer> create_convolution(cv::dnn::LayerParams& params) {
  if (const auto stride = depthwise_stride(params)) {
    ++g_depthwise_layers;
    return cv::makePtr<DepthwiseConv3x3Layer>(params, *stride);
  }
  return cv::dnn::ConvolutionLayer::create(params);
}

}  // namespace

ScopedDepthwiseConvLayer::ScopedDepthwiseConvLayer() : lock_(scope_mutex()) {
  g_depthwise_layers = 0;
  cv::dnn::LayerFactory::registerLayer("Convolution", create_convolution);
}

ScopedDepthwiseConvLayer::~ScopedDepthwiseConvLayer() {
  cv::dnn::LayerFactory::unregisterLayer("Convolution");
}

int ScopedDepthwiseConvLayer::depthwise_layers() const { return g_depthwise_layers; }

}  // namespace ferry::route
