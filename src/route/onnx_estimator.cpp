// SPDX-License-Identifier: Apache-2.0
// ONNX pixel estimator through OpenCV DNN (see onnx_estimator.h).
#include "route/onnx_estimator.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string_view>

#include <opencv2/imgproc.hpp>

#include "route/conv_layer_scope.h"

namespace ferry::route {
namespace {

// kDefault -> what environment variable `var` asks for (unset or "ferry": ferry's kernel).
Status resolve_kernel(const char* var, SkipConvKernel& kernel) {
  if (kernel != SkipConvKernel::kDefault) return Status::ok_status();
  const char* env = std::getenv(var);
  const std::string_view v = env != nullptr ? env : "";
  if (v.empty() || v == "ferry") {
    kernel = SkipConvKernel::kFerryKernel;
  } else if (v == "opencv") {
    kernel = SkipConvKernel::kOpenCv;
  } else {
    return invalid_argument("route: skip estimator: {}={} is not ferry or opencv", var, v);
  }
  return Status::ok_status();
}

}  // namespace

Result<SkipEstimator> SkipEstimator::load(const std::string& onnx_path, SkipEstimatorOptions opt) {
  if (opt.size < 8 || opt.size > 4096) {
    return invalid_argument("route: skip estimator: input size {} out of [8, 4096]", opt.size);
  }
  for (int c = 0; c < 3; ++c) {
    if (!(opt.std[c] > 0) || !std::isfinite(opt.mean[c])) {
      return invalid_argument("route: skip estimator: bad normalisation for channel {}", c);
    }
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(onnx_path, ec)) {
    return not_found("route: skip estimator: model {} not found", onnx_path);
  }
  FERRY_TRY(resolve_kernel("FERRY_ROUTE_DW", opt.depthwise));
  FERRY_TRY(resolve_kernel("FERRY_ROUTE_PW", opt.pointwise));
  SkipEstimator e;
  e.opt_ = opt;
  try {
    std::optional<ScopedFerryConvLayers> scope;
    const FerryConvKinds kinds{.depthwise = opt.depthwise == SkipConvKernel::kFerryKernel,
                               .pointwise = opt.pointwise == SkipConvKernel::kFerryKernel};
    if (kinds.depthwise || kinds.pointwise) scope.emplace(kinds);
    e.net_ = cv::dnn::readNetFromONNX(onnx_path);
    if (scope) {
      e.ferry_depthwise_layers_ = scope->depthwise_layers();
      e.ferry_pointwise_layers_ = scope->pointwise_layers();
    }
  } catch (const cv::Exception& ex) {
    return corrupt("route: skip estimator: opencv cannot read {}: {}", onnx_path, ex.what());
  }
  if (e.net_.empty()) return corrupt("route: skip estimator: {} holds no network", onnx_path);
  e.net_.setPreferableBackend(cv::dnn::DNN_BACKEND_OPENCV);
  e.net_.setPreferableTarget(cv::dnn::DNN_TARGET_CPU);
  return e;
}

Result<cv::Mat> SkipEstimator::preprocess(const cv::Mat& image) const {
  if (image.empty() || image.depth() != CV_8U || image.channels() != 3) {
    return invalid_argument(
        "route: skip estimator: need a non-empty 8-bit 3-channel image, got {}x{} depth {} "
        "channels {}",
        image.cols, image.rows, image.depth(), image.channels());
  }
  const int s = opt_.size;
  cv::Mat resized;
  if (image.cols == s && image.rows == s) {
    resized = image;
  } else {
    const bool shrink = image.cols >= s && image.rows >= s;
    cv::resize(image, resized, cv::Size(s, s), 0, 0, shrink ? cv::INTER_AREA : cv::INTER_LINEAR);
  }
  const int blob_shape[4] = {1, 3, s, s};
  cv::Mat blob(4, blob_shape, CV_32F);
  float* out = blob.ptr<float>();
  const std::size_t plane = static_cast<std::size_t>(s) * static_cast<std::size_t>(s);
  for (int y = 0; y < s; ++y) {
    const auto* row = resized.ptr<cv::Vec3b>(y);
    for (int x = 0; x < s; ++x) {
      for (int c = 0; c < 3; ++c) {  // c: RGB channel index
        const int src_c = opt_.bgr_input ? 2 - c : c;
        const float v = static_cast<float>(row[x][src_c]) / 255.0f;
        out[static_cast<std::size_t>(c) * plane + static_cast<std::size_t>(y) * s + x] =
            (v - opt_.mean[c]) / opt_.std[c];
      }
    }
  }
  return blob;
}

Result<float> SkipEstimator::score(const cv::Mat& image) {
  FERRY_ASSIGN_OR_RETURN(cv::Mat blob, preprocess(image));
  cv::Mat out;
  try {
    net_.setInput(blob);
    out = net_.forward();
  } catch (const cv::Exception& ex) {
    return internal_error("route: skip estimator: opencv forward failed: {}", ex.what());
  }
  if (out.total() != 1 || out.depth() != CV_32F) {
    return internal_error("route: skip estimator: expected one float output, got {} values",
                          out.total());
  }
  const float v = out.ptr<float>()[0];
  if (!std::isfinite(v)) return internal_error("route: skip estimator: non-finite output");
  return v;
}

}  // namespace ferry::route
