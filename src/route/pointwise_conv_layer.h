// SPDX-License-Identifier: Apache-2.0
// An OpenCV DNN layer that runs pointwise convolutions (1x1 kernel, stride 1, pad 0, dilation 1,
// group 1, optional bias) with ferry's kernel (pointwise_conv.h). Like OpenCV's convolution it
// fuses a following BatchNorm/Scale (tryFuse) and ReLU/ReLU6 (setActivation); the residual Add
// after MobileNetV2's projection convolutions stays OpenCV's Eltwise layer (~0.05 ms of the
// forward in all, docs/route_estimators.md). conv_layer_scope.h hands it to OpenCV's ONNX
// importer; every convolution it does not take stays OpenCV's.
// Covered by tests/unit/route/onnx_estimator_test.cpp (ferry vs OpenCV per layer and end to end).
#pragma once

#include <opencv2/dnn.hpp>

namespace ferry::route {

// Ferry's layer if `params` describe a convolution the pointwise kernel handles, else empty.
cv::Ptr<cv::dnn::Layer> make_pointwise_conv_layer(const cv::dnn::LayerParams& params);

}  // namespace ferry::route
