// SPDX-License-Identifier: Apache-2.0
// Ferry's pointwise kernel against OpenCV DNN's own convolution, layer by layer, on the skip
// estimator: for each of the net's 25 1x1 convolutions, OpenCV (fusion off, so its outputs are the
// convolutions alone) gives the layer's input and output on a preprocessed frame; the kernel runs
// on that input with the layer's weights and bias. Both are float sums of the same products in a
// different order, so each is within a few naive-loop errors of the double-precision sum:
// asserted err(ferry) <= 2 err(naive float) + 1e-6 (style.md rule a) and
// |ferry - OpenCV| <= 4 err(naive float) + 1e-6 (ferry's bound plus the same bound for OpenCV).
// Run for every kernel path the CPU has. Also checks that ferry's layer is what the scope puts in
// the net (and where).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <opencv2/dnn.hpp>
#include <opencv2/dnn/all_layers.hpp>

#include "route/conv_layer_scope.h"
#include "route/onnx_estimator.h"
#include "route/pointwise_conv.h"

namespace ferry::route {
namespace {

const std::string kOnnx =
    std::string(FERRY_TEST_DATA_DIR) + "/route/skip_mobilenet_v2_offloadbin.onnx";

bool is_pointwise_weight(const cv::Ptr<cv::dnn::Layer>& l) {
  return l->type == "Convolution" && !l->blobs.empty() && l->blobs[0].dims == 4 &&
         l->blobs[0].size[2] == 1 && l->blobs[0].size[3] == 1;
}

TEST(RoutePointwiseConvLayer, MatchesOpenCvLayerByLayer) {
  if (!std::filesystem::exists(kOnnx)) GTEST_SKIP() << "SKIPPED: no " << kOnnx;
  auto est = SkipEstimator::load(kOnnx);
  ASSERT_TRUE(est.ok());
  cv::Mat img(200, 160, CV_8UC3);
  cv::theRNG().state = 11;
  cv::randu(img, 0, 256);
  auto blob = est->preprocess(img);
  ASSERT_TRUE(blob.ok());

  cv::dnn::Net net = cv::dnn::readNetFromONNX(kOnnx);  // OpenCV's layers only
  net.setPreferableBackend(cv::dnn::DNN_BACKEND_OPENCV);
  net.setPreferableTarget(cv::dnn::DNN_TARGET_CPU);
  net.enableFusion(false);
  std::vector<int> conv_ids;
  std::vector<cv::String> names;  // [input of conv 0, conv 0, input of conv 1, conv 1, ...]
  for (const cv::String& name : net.getLayerNames()) {
    const int id = net.getLayerId(name);
    cv::Ptr<cv::dnn::Layer> l = net.getLayer(id);
    if (!is_pointwise_weight(l)) continue;
    const std::vector<cv::Ptr<cv::dnn::Layer>> ins = net.getLayerInputs(id);
    ASSERT_EQ(ins.size(), 1u) << name;
    conv_ids.push_back(id);
    names.push_back(ins[0]->name);
    names.push_back(name);
  }
  ASSERT_EQ(conv_ids.size(), 25u);
  net.setInput(*blob);
  std::vector<cv::Mat> outs;
  net.forward(outs, names);
  ASSERT_EQ(outs.size(), names.size());

  for (std::size_t k = 0; k < conv_ids.size(); ++k) {
    cv::Ptr<cv::dnn::Layer> l = net.getLayer(conv_ids[k]);
    const cv::Mat& in = outs[2 * k];          // [1, C_in, H, W]
    const cv::Mat& cv_out = outs[2 * k + 1];  // [1, C_out, H, W]
    const cv::Mat& w = l->blobs[0];           // [C_out, C_in, 1, 1]
    const int c_out = w.size[0], c_in = w.size[1];
    const int pixels = in.size[2] * in.size[3];
    ASSERT_EQ(in.size[1], c_in) << l->name;
    ASSERT_EQ(static_cast<int>(cv_out.total()), c_out * pixels) << l->name;
    ASSERT_EQ(l->blobs.size(), 2u) << l->name;  // BatchNorm folded into a bias at export
    const float* wp = w.ptr<float>();
    const float* bp = l->blobs[1].ptr<float>();
    const float* x = in.ptr<float>();
    std::vector<float> wt(static_cast<std::size_t>(c_in) * c_out);
    pointwise_conv_transpose_weights(wp, c_out, c_in, wt.data());
    // Exact (double) and naive float sums, once per layer.
    std::vector<double> exact(static_cast<std::size_t>(c_out) * pixels);
    double err_naive = 0;
    for (int co = 0; co < c_out; ++co) {
      for (int p = 0; p < pixels; ++p) {
        double e = bp[co];
        float naive = bp[co];
        for (int ci = 0; ci < c_in; ++ci) {
          const float wv = wp[static_cast<std::size_t>(co) * c_in + ci];
          const float xv = x[static_cast<std::size_t>(ci) * pixels + p];
          e += static_cast<double>(wv) * xv;
          naive += wv * xv;
        }
        exact[static_cast<std::size_t>(co) * pixels + p] = e;
        err_naive = std::max(err_naive, std::abs(naive - e));
      }
    }
    // Every path this CPU has (the estimator itself runs the widest).
    for (const char* isa : {"scalar", "avx2", "avx512"}) {
      const std::string name = isa;
      if ((name == "avx2" && !pointwise_conv_have_avx2()) ||
          (name == "avx512" && !pointwise_conv_have_avx512())) {
        continue;
      }
      std::vector<float> got(static_cast<std::size_t>(c_out) * pixels);
      PointwiseConvArgs a;
      a.in = x;
      a.weight_t = wt.data();
      a.bias = bp;
      a.out = got.data();
      a.in_channels = c_in;
      a.out_channels = c_out;
      a.pixels = pixels;
      if (name == "scalar") pointwise_conv_scalar(a);
      if (name == "avx2") pointwise_conv_avx2(a);
      if (name == "avx512") pointwise_conv_avx512(a);
      double err = 0, diff_cv = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, std::abs(got[i] - exact[i]));
        diff_cv = std::max(diff_cv, static_cast<double>(std::abs(got[i] - cv_out.ptr<float>()[i])));
      }
      EXPECT_LE(err, 2 * err_naive + 1e-6) << l->name << " isa=" << name;
      EXPECT_LE(diff_cv, 4 * err_naive + 1e-6) << l->name << " isa=" << name;
    }
  }
}

// The scope puts ferry's pointwise layer exactly where the weights are 1x1 and leaves the first
// full 3x3 convolution to OpenCV.
TEST(RoutePointwiseConvLayer, ScopeTakesOnlyPointwiseWhenAskedTo) {
  if (!std::filesystem::exists(kOnnx)) GTEST_SKIP() << "SKIPPED: no " << kOnnx;
  cv::dnn::Net net;
  int pw = 0, dw = 0;
  {
    ScopedFerryConvLayers scope({.depthwise = false, .pointwise = true});
    net = cv::dnn::readNetFromONNX(kOnnx);
    pw = scope.pointwise_layers();
    dw = scope.depthwise_layers();
  }
  EXPECT_EQ(pw, 25);
  EXPECT_EQ(dw, 0);
  int ours = 0, opencv_pointwise = 0, opencv_other = 0;
  for (const cv::String& name : net.getLayerNames()) {
    cv::Ptr<cv::dnn::Layer> l = net.getLayer(name);
    if (l->type != "Convolution") continue;
    const bool opencv = !l.dynamicCast<cv::dnn::ConvolutionLayer>().empty();
    if (!opencv) ++ours;
    if (opencv && is_pointwise_weight(l)) ++opencv_pointwise;
    if (opencv && !is_pointwise_weight(l)) ++opencv_other;
  }
  EXPECT_EQ(ours, 25);
  EXPECT_EQ(opencv_pointwise, 0);
  EXPECT_EQ(opencv_other, 14);  // the first full 3x3 and the 13 depthwise convolutions
}

}  // namespace
}  // namespace ferry::route
