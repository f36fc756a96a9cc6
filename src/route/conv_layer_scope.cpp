// SPDX-License-Identifier: Apache-2.0
// Scoped registration of ferry's convolution layers in OpenCV DNN (see conv_layer_scope.h).
#include "route/conv_layer_scope.h"

#include <opencv2/dnn.hpp>
#include <opencv2/dnn/all_layers.hpp>

#include "route/depthwise_conv_layer.h"
#include "route/pointwise_conv_layer.h"

namespace ferry::route {
namespace {

std::mutex& scope_mutex() {
  static std::mutex m;
  return m;
}
// All guarded by scope_mutex(): the kinds of the live scope and what it created.
FerryConvKinds g_kinds;
int g_depthwise_layers = 0;
int g_pointwise_layers = 0;

cv::Ptr<cv::dnn::Layer> create_convolution(cv::dnn::LayerParams& params) {
  if (g_kinds.depthwise) {
    if (cv::Ptr<cv::dnn::Layer> l = make_depthwise_conv_layer(params); !l.empty()) {
      ++g_depthwise_layers;
      return l;
    }
  }
  if (g_kinds.pointwise) {
    if (cv::Ptr<cv::dnn::Layer> l = make_pointwise_conv_layer(params); !l.empty()) {
      ++g_pointwise_layers;
      return l;
    }
  }
  return cv::dnn::ConvolutionLayer::create(params);
}

}  // namespace

ScopedFerryConvLayers::ScopedFerryConvLayers(FerryConvKinds kinds) : lock_(scope_mutex()) {
  g_kinds = kinds;
  g_depthwise_layers = 0;
  g_pointwise_layers = 0;
  cv::dnn::LayerFactory::registerLayer("Convolution", create_convolution);
}

ScopedFerryConvLayers::~ScopedFerryConvLayers() {
  cv::dnn::LayerFactory::unregisterLayer("Convolution");
}

int ScopedFerryConvLayers::depthwise_layers() const { return g_depthwise_layers; }
int ScopedFerryConvLayers::pointwise_layers() const { return g_pointwise_layers; }

}  // namespace ferry::route
