// SPDX-License-Identifier: Apache-2.0
// An OpenCV DNN "Convolution" layer constructor that runs depthwise 3x3 convolutions (group ==
// input channels == output channels, pad 1, stride 1 or 2, dilation 1, optional bias) with
// ferry's kernel (depthwise_conv.h) and hands every other convolution to OpenCV's own
// cv::dnn::ConvolutionLayer::create, so those keep all of OpenCV's behaviour (fusion included).
// The depthwise layer fuses a following BatchNorm/Scale (tryFuse) and ReLU/ReLU6 (setActivation)
// itself, as OpenCV's convolution does.
//
// Registration is scoped: while a ScopedDepthwiseConvLayer lives, LayerFactory hands out this
// constructor for "Convolution"; its destructor unregisters it, which in OpenCV 4.6 pops it off
// the type's constructor stack and restores OpenCV's own. OpenCV instantiates layers while the
// ONNX importer runs (it asks each layer for its output shapes), so wrapping readNetFromONNX is
// enough. Scopes are serialised by a process-wide mutex (LayerFactory refuses to register the same
// constructor twice). A net read on another thread during a scope also gets this layer: its
// outputs match OpenCV's within float rounding (tests/unit/route/onnx_estimator_test.cpp).
#pragma once

#include <mutex>

namespace ferry::route {

class ScopedDepthwiseConvLayer {
 public:
  ScopedDepthwiseConvLayer();
  ~ScopedDepthwiseConvLayer();
  ScopedDepthwiseConvLayer(const ScopedDepthwiseConvLayer&) = delete;
  ScopedDepthwiseConvLayer& operator=(const ScopedDepthwiseConvLayer&) = delete;

  // Convolution layers created in this scope that run on ferry's depthwise kernel.
  int depthwise_layers() const;

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace ferry::route
