// SPDX-License-Identifier: Apache-2.0
// OpenCV DNN layer around the pointwise 1x1 kernel (see pointwise_conv_layer.h).
#include "route/pointwise_conv_layer.h"

#include <algorithm>
#include <limits>
#include <vector>

#include <opencv2/dnn/all_layers.hpp>

#include "route/conv_layer_util.h"
#include "route/pointwise_conv.h"

namespace ferry::route {
namespace {

// True if `params` describe a convolution the pointwise kernel handles.
bool is_pointwise(const cv::dnn::LayerParams& params) {
  if (params.blobs.empty()) return false;
  const cv::Mat& w = params.blobs[0];  // [C_out, C_in, 1, 1]
  if (w.dims != 4 || w.size[2] != 1 || w.size[3] != 1) return false;
  return conv_params_are_plain(params, w.size[0]) && params.get<int>("group", 1) == 1 &&
         conv_param_all_equal(params, "kernel_size", 1) && conv_param_all_equal(params, "pad", 0) &&
         conv_param_all_equal(params, "stride", 1) && conv_param_all_equal(params, "dilation", 1);
}

class PointwiseConvLayer final : public cv::dnn::Layer {
 public:
  explicit PointwiseConvLayer(const cv::dnn::LayerParams& params) : cv::dnn::Layer(params) {
    const cv::Mat& w = params.blobs[0];
    out_channels_ = w.size[0];
    in_channels_ = w.size[1];
    weight_.assign(w.ptr<float>(), w.ptr<float>() + w.total());
    bias_.assign(static_cast<std::size_t>(out_channels_), 0.0f);
    if (params.blobs.size() == 2) {
      const float* b = params.blobs[1].ptr<float>();
      std::copy(b, b + out_channels_, bias_.begin());
    }
    transpose_weights();
  }

  bool supportBackend(int backend_id) override { return backend_id == cv::dnn::DNN_BACKEND_OPENCV; }

  bool getMemoryShapes(const std::vector<cv::dnn::MatShape>& inputs, int /*required_outputs*/,
                       std::vector<cv::dnn::MatShape>& outputs,
                       std::vector<cv::dnn::MatShape>& /*internals*/) const override {
    CV_Assert(inputs.size() == 1 && inputs[0].size() == 4 && inputs[0][1] == in_channels_);
    const cv::dnn::MatShape& in = inputs[0];  // [N, C_in, H, W]
    outputs.assign(1, {in[0], out_channels_, in[2], in[3]});
    return false;
  }

  void forward(cv::InputArrayOfArrays inputs_arr, cv::OutputArrayOfArrays outputs_arr,
               cv::OutputArrayOfArrays /*internals*/) override {
    std::vector<cv::Mat> inputs, outputs;
    inputs_arr.getMatVector(inputs);
    outputs_arr.getMatVector(outputs);
    const cv::Mat& in = inputs[0];  // [N, C_in, H, W]
    cv::Mat& out = outputs[0];      // [N, C_out, H, W]
    CV_Assert(in.type() == CV_32F && in.isContinuous() && out.isContinuous() &&
              in.size[1] == in_channels_ && out.size[1] == out_channels_);
    PointwiseConvArgs a;
    a.weight_t = weight_t_.data();
    a.bias = bias_.data();
    a.in_channels = in_channels_;
    a.out_channels = out_channels_;
    a.pixels = in.size[2] * in.size[3];
    a.clamp_min = clamp_min_;
    a.clamp_max = clamp_max_;
    for (int i = 0; i < in.size[0]; ++i) {
      a.in = in.ptr<float>(i);
      a.out = out.ptr<float>(i);
      pointwise_conv(a);
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
    if (!per_channel_scale_shift(top, out_channels_, scale, shift)) return false;
    for (int co = 0; co < out_channels_; ++co) {
      float* row = weight_.data() + static_cast<std::size_t>(co) * in_channels_;
      for (int ci = 0; ci < in_channels_; ++ci) row[ci] *= scale[co];
      bias_[static_cast<std::size_t>(co)] =
          bias_[static_cast<std::size_t>(co)] * scale[co] + shift[co];
    }
    transpose_weights();
    return true;
  }

 private:
  static constexpr float kNoClamp = -std::numeric_limits<float>::infinity();

  void transpose_weights() {
    weight_t_.resize(weight_.size());
    pointwise_conv_transpose_weights(weight_.data(), out_channels_, in_channels_, weight_t_.data());
  }

  int in_channels_ = 0;
  int out_channels_ = 0;
  std::vector<float> weight_;    // [C_out, C_in]; BatchNorm/Scale folded in by tryFuse
  std::vector<float> weight_t_;  // [C_in, C_out]: weight_ transposed, what the kernel reads
  std::vector<float> bias_;      // [C_out]
  float clamp_min_ = kNoClamp;
  float clamp_max_ = -kNoClamp;
};

}  // namespace

cv::Ptr<cv::dnn::Layer> make_pointwise_conv_layer(const cv::dnn::LayerParams& params) {
  if (is_pointwise(params)) return cv::makePtr<PointwiseConvLayer>(params);
  return {};
}

}  // namespace ferry::route
