// SPDX-License-Identifier: Apache-2.0
// Puts ferry's convolution layers into OpenCV DNN while a net is read: while a
// ScopedFerryConvLayers lives, LayerFactory hands out ferry's "Convolution" constructor, which
// returns ferry's depthwise 3x3 layer (depthwise_conv_layer.h) or pointwise 1x1 layer
// (pointwise_conv_layer.h) where the parameters fit and the kind is enabled, and
// cv::dnn::ConvolutionLayer::create(params) itself — not a wrapper — for every other convolution,
// so those keep all of OpenCV's behaviour (fusion included). The destructor unregisters it, which
// in OpenCV 4.6 pops it off the type's constructor stack and restores OpenCV's own. OpenCV
// instantiates layers while the ONNX importer runs (it asks each layer for its output shapes), so
// wrapping readNetFromONNX is enough. Scopes are serialised by a process-wide mutex (LayerFactory
// refuses to register the same constructor twice). A net read on another thread during a scope also
// gets ferry's layers: their outputs match OpenCV's within float rounding
// (tests/unit/route/onnx_estimator_test.cpp).
//
// Usage:
//   ScopedFerryConvLayers scope({.depthwise = true, .pointwise = true});
//   cv::dnn::Net net = cv::dnn::readNetFromONNX(path);
//   // scope.depthwise_layers() / pointwise_layers(): how many layers ferry took
#pragma once

#include <mutex>

namespace ferry::route {

struct FerryConvKinds {
  bool depthwise = true;  // depthwise 3x3 (stride 1/2) on depthwise_conv.h
  bool pointwise = true;  // 1x1 stride 1 on pointwise_conv.h
};

class ScopedFerryConvLayers {
 public:
  explicit ScopedFerryConvLayers(FerryConvKinds kinds = {});
  ~ScopedFerryConvLayers();
  ScopedFerryConvLayers(const ScopedFerryConvLayers&) = delete;
  ScopedFerryConvLayers& operator=(const ScopedFerryConvLayers&) = delete;

  // Convolution layers created in this scope that run on ferry's depthwise / pointwise kernel.
  int depthwise_layers() const;
  int pointwise_layers() const;

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace ferry::route
