// SPDX-License-Identifier: Apache-2.0
// Helpers shared by ferry's OpenCV DNN convolution layers (depthwise_conv_layer.h,
// pointwise_conv_layer.h): which ONNX-importer parameters a layer accepts, and the fusions OpenCV
// offers a convolution (a following ReLU/ReLU6 as a clamp, a following BatchNorm/Scale as a
// per-channel scale and shift), done the way OpenCV's own convolution does them.
#pragma once

#include <string>
#include <vector>

#include <opencv2/dnn.hpp>
#include <opencv2/dnn/all_layers.hpp>

namespace ferry::route {

// True if every entry of params[key] (when present) equals `want`.
bool conv_param_all_equal(const cv::dnn::LayerParams& params, const std::string& key, int want);

// True if `params` hold only the plain keys the ONNX importer writes for a convolution (no per-side
// pads, auto_pad, ceil_mode, ...), float weights (`depth`) and 1 or 2 float blobs (weight, bias)
// with the bias, if any, of `out_channels` values.
bool conv_params_are_plain(const cv::dnn::LayerParams& params, int out_channels);

// ReLU (slope 0) and ReLU6 narrow [lo, hi]; false (nothing changed) for any other activation.
bool fold_clamp_activation(const cv::Ptr<cv::dnn::ActivationLayer>& layer, float& lo, float& hi);

// The per-channel scale and shift of `top` (BatchNorm, Scale), `channels` values each (a single
// value is broadcast; a missing scale is 1, a missing shift 0). False if top offers none or they
// are not per-channel floats.
bool per_channel_scale_shift(const cv::Ptr<cv::dnn::Layer>& top, int channels,
                             std::vector<float>& scale, std::vector<float>& shift);

}  // namespace ferry::route
