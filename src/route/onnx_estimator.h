// SPDX-License-Identifier: Apache-2.0
// The weak-skipping pixel estimator: an ONNX model (tools/route/export_skip_estimator.py exports
// the bgt-ada MobileNetV2-cut-at-block-13 checkpoint) run by OpenCV DNN on the CPU.
//
// Preprocessing (must match the export script): resize to size x size (INTER_AREA when shrinking,
// which averages like an anti-aliased resize and is exact for integer factors; INTER_LINEAR when
// enlarging), channels to RGB, x = (pixel / 255 − mean[c]) / std[c] with the ImageNet mean/std,
// NCHW float32. The score is the network's raw output (a logit for OffloadBin); the router ranks
// scores through an ECDF, so no squashing is applied.
//
// Not thread-safe: cv::dnn::Net::forward mutates the net; use one estimator per thread.
// Thread count is OpenCV's global setting (cv::setNumThreads); the latency target (≤ 3 ms at
// 128x128) is for one thread (bench/route/skip_estimator_bench.cpp).
// Depthwise 3x3 and pointwise 1x1 convolutions run on ferry's kernels (conv_layer_scope.h)
// unless turned off (SkipConvKernel::kOpenCv, or FERRY_ROUTE_DW=opencv / FERRY_ROUTE_PW=opencv
// with the default option): OpenCV 4.6 runs depthwise at ~2.4 GMAC/s and pointwise at 12-30
// GMAC/s, together ~90 % of its forward time (docs/route_estimators.md "Latency").
// Covered by tests/unit/route/onnx_estimator_test.cpp (parity with PyTorch to 1e-4, ferry kernels
// vs OpenCV-only to 1e-5, layer by layer and end to end).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include <opencv2/core.hpp>
#include <opencv2/dnn.hpp>

#include "core/result.h"

namespace ferry::route {

// Who runs one kind of convolution. kDefault reads the kind's variable (FERRY_ROUTE_DW for the
// depthwise 3x3 layers, FERRY_ROUTE_PW for the pointwise 1x1 ones): unset or "ferry" ->
// kFerryKernel, "opencv" -> kOpenCv, anything else -> load() fails with kInvalidArgument.
// Both kOpenCv (FERRY_ROUTE_DW=opencv FERRY_ROUTE_PW=opencv) is OpenCV DNN alone.
enum class SkipConvKernel : std::uint8_t { kDefault, kFerryKernel, kOpenCv };

struct SkipEstimatorOptions {
  int size = 128;
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};  // RGB order
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
  bool bgr_input = true;  // images come as OpenCV BGR; false: already RGB
  SkipConvKernel depthwise = SkipConvKernel::kDefault;
  SkipConvKernel pointwise = SkipConvKernel::kDefault;
};

class SkipEstimator {
 public:
  // kNotFound: no file; kCorrupt: OpenCV cannot parse it; kInvalidArgument: bad options.
  static Result<SkipEstimator> load(const std::string& onnx_path, SkipEstimatorOptions opt = {});

  // image: 8-bit, 3 channels, any size >= 1x1. kInvalidArgument otherwise; kInternal if OpenCV
  // fails at run time or the output is not one finite number.
  Result<float> score(const cv::Mat& image);

  // The NCHW float blob fed to the network (exposed for tests).
  Result<cv::Mat> preprocess(const cv::Mat& image) const;

  const SkipEstimatorOptions& options() const { return opt_; }
  // Convolution layers of the net that run on ferry's depthwise kernel (0 with kOpenCv; 13 for
  // the MobileNetV2 cut at block 13).
  int ferry_depthwise_layers() const { return ferry_depthwise_layers_; }
  // Convolution layers on ferry's pointwise kernel (0 with kOpenCv; 25 for this net).
  int ferry_pointwise_layers() const { return ferry_pointwise_layers_; }

 private:
  cv::dnn::Net net_;
  SkipEstimatorOptions opt_;
  cv::Mat resized_, rgb_;  // reused buffers
  int ferry_depthwise_layers_ = 0;
  int ferry_pointwise_layers_ = 0;
};

}  // namespace ferry::route
