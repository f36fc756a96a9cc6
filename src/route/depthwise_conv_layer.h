// SPDX-License-Identifier: Apache-2.0
// An OpenCV DNN layer that runs depthwise 3x3 convolutions (group == input channels == output
// channels, pad 1, stride 1 or 2, dilation 1, optional bias) with ferry's kernel
// (depthwise_conv.h). It fuses a following BatchNorm/Scale (tryFuse) and ReLU/ReLU6
// (setActivation) itself, as OpenCV's convolution does. conv_layer_scope.h hands it to OpenCV's
// ONNX importer; every convolution it does not take stays OpenCV's.
// Covered by tests/unit/route/onnx_estimator_test.cpp (ferry vs OpenCV per layer and end to end).
#pragma once

#include <opencv2/dnn.hpp>

namespace ferry::route {

// Ferry's layer if `params` describe a convolution the depthwise kernel handles, else empty.
cv::Ptr<cv::dnn::Layer> make_depthwise_conv_layer(const cv::dnn::LayerParams& params);

}  // namespace ferry::route
