// SPDX-License-Identifier: Apache-2.0
// OpenCV DNN layer around the depthwise 3x3 kernel (see depthwise_conv_layer.h).
#include "route/depthwise_conv_layer.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include <opencv2/dnn/all_layers.hpp>

#include "route/conv_layer_util.h"
#include "route/depthwise_conv.h"

namespace ferry::route {
namespace {

// The stride (1 or 2) if `params` describe a convolution our kernel handles; nullopt otherwise.
std::optional<int> depthwise_stride(const cv::dnn::LayerParams& params) {
  if (params.blobs.empty()) return std::nullopt;
  const cv::Mat& w = params.blobs[0];  // [C, 1, 3, 3]
  if (w.dims != 4 || w.size[1] != 1 || w.size[2] != 3 || w.size[3] != 3) return std::nullopt;
  const int c = w.size[0];
  if (!conv_params_are_plain(params, c) || params.get<int>("group", 1) != c) return std::nullopt;
  if (!conv_param_all_equal(params, "kernel_size", 3) || !conv_param_all_equal(params, "pad", 1) ||
      !conv_param_all_equal(params, "dilation", 1) || !params.has("pad")) {
    return std::nullopt;
  }
  if (conv_param_all_equal(params, "stride", 1)) return 1;
  if (conv_param_all_equal(params, "stride", 2)) return 2;
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
    return fold_clamp_activation(layer, clamp_min_, clamp_max_);
  }

  // A following per-channel scale/shift (BatchNorm, Scale) folds into weights and bias, unless an
  // activation is already fused (it would then apply before the scale).
  bool tryFuse(cv::Ptr<cv::dnn::Layer>& top) override {
    if (clamp_min_ != kNoClamp || clamp_max_ != -kNoClamp) return false;
    std::vector<float> scale, shift;
    if (!per_channel_scale_shift(top, channels_, scale, shift)) return false;
    for (int c = 0; c < channels_; ++c) {
      for (int k = 0; k < 9; ++k) weight_[static_cast<std::size_t>(c) * 9 + k] *= scale[c];
      bias_[static_cast<std::size_t>(c)] = bias_[static_cast<std::size_t>(c)] * scale[c] + shift[c];
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

}  // namespace

cv::Ptr<cv::dnn::Layer> make_depthwise_conv_layer(const cv::dnn::LayerParams& params) {
  if (const auto stride = depthwise_stride(params)) {
    return cv::makePtr<DepthwiseConv3x3Layer>(params, *stride);
  }
  return {};
}

}  // namespace ferry::route
