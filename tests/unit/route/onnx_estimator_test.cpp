// SPDX-License-Identifier: Apache-2.0
// The ONNX skip estimator under OpenCV DNN against PyTorch's outputs of the original checkpoint
// (tests/data/route/skip_parity.json, written by tools/route/export_skip_estimator.py on the same
// images), ferry's depthwise and pointwise kernels against OpenCV-only on a few frames, the
// environment switches, plus preprocessing and bad-input cases.
#include "route/onnx_estimator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <opencv2/dnn/all_layers.hpp>
#include <opencv2/imgproc.hpp>

#include "core/file_util.h"
#include "core/json.h"
#include "scoped_env.h"

namespace ferry::route {
namespace {

using ferry::testing::ScopedEnv;

const std::string kDir = std::string(FERRY_TEST_DATA_DIR) + "/route/";
const std::string kOnnx = kDir + "skip_mobilenet_v2_offloadbin.onnx";

// The export script's synthetic_image(i): RGB pixel (x, y, c) =
// (x(3+i) + y(5+2c) + 40c + 17i + floor(xy / (7+i))) mod 256. Returned as an RGB cv::Mat.
cv::Mat synthetic_rgb(int i) {
  cv::Mat img(128, 128, CV_8UC3);
  for (int y = 0; y < 128; ++y) {
    for (int x = 0; x < 128; ++x) {
      for (int c = 0; c < 3; ++c) {
        img.at<cv::Vec3b>(y, x)[c] = static_cast<std::uint8_t>(
            (x * (3 + i) + y * (5 + 2 * c) + 40 * c + 17 * i + (x * y) / (7 + i)) % 256);
      }
    }
  }
  return img;
}

// FNV-1a 64 of the four images' bytes; the export script's skip_parity.u8 hashes to this value
// (checked when the fixture was made), so the C++ images are the ones PyTorch saw.
TEST(RouteOnnxEstimator, SyntheticImagesAreThePythonOnes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (int i = 0; i < 4; ++i) {
    const cv::Mat img = synthetic_rgb(i);
    for (std::size_t k = 0; k < img.total() * 3; ++k) {
      h = (h ^ img.data[k]) * 0x100000001b3ULL;
    }
  }
  EXPECT_EQ(h, 0xc707463050a4aa5dULL);
}

TEST(RouteOnnxEstimator, MatchesPyTorchWithin1e4) {
  if (!std::filesystem::exists(kOnnx)) {
    GTEST_SKIP() << "SKIPPED: run tools/route/export_skip_estimator.py (no " << kOnnx << ")";
  }
  auto text = read_file(kDir + "skip_parity.json");
  ASSERT_TRUE(text.ok());
  auto ref = parse_json(*text, "skip_parity.json");
  ASSERT_TRUE(ref.ok());
  const auto expected = (*ref)["torch_fp32"].get<std::vector<double>>();
  ASSERT_EQ(expected.size(), 4u);

  SkipEstimatorOptions rgb_opt;
  rgb_opt.bgr_input = false;
  auto est_rgb = SkipEstimator::load(kOnnx, rgb_opt);
  ASSERT_TRUE(est_rgb.ok()) << est_rgb.status().to_string();
  auto est_bgr = SkipEstimator::load(kOnnx);  // default: OpenCV BGR input
  ASSERT_TRUE(est_bgr.ok());
  for (int i = 0; i < 4; ++i) {
    const cv::Mat rgb = synthetic_rgb(i);
    auto s = est_rgb->score(rgb);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_NEAR(*s, expected[static_cast<std::size_t>(i)], 1e-4) << "image " << i;
    cv::Mat bgr;
    cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
    auto sb = est_bgr->score(bgr);
    ASSERT_TRUE(sb.ok());
    EXPECT_NEAR(*sb, expected[static_cast<std::size_t>(i)], 1e-4) << "image " << i << " (bgr)";
    // A 2x pixel-replicated copy shrinks back exactly under INTER_AREA: same score.
    cv::Mat big;
    cv::resize(bgr, big, cv::Size(256, 256), 0, 0, cv::INTER_NEAREST);
    auto sbig = est_bgr->score(big);
    ASSERT_TRUE(sbig.ok());
    EXPECT_NEAR(*sbig, *sb, 1e-6) << "image " << i << " (256x256)";
  }
}

// Ferry's kernels in the net (depthwise only, pointwise only, both) give OpenCV-only's score within
// 1e-5 relative (1e-5 * max(1, |score|)) on the synthetic images and random frames of several
// sizes, and really are in use (13 depthwise and 25 pointwise layers of the MobileNetV2 cut at
// block 13). Each layer differs from OpenCV's only by float summation order (a few naive-loop
// errors per layer, checked per layer in pointwise_conv_layer_test.cpp); over the 52 layers this
// grows to a relative error of ~1e-6 (measured: up to 1.5e-5 on a score of 11.8 with the pointwise
// kernel, 16 float ulps there), so the bound is relative and ~8x above what was seen.
// Also: loading with the kernels leaves OpenCV's own convolution registered for the next net.
TEST(RouteOnnxEstimator, FerryKernelsMatchOpenCvWithin1e5) {
  if (!std::filesystem::exists(kOnnx)) GTEST_SKIP() << "SKIPPED: no " << kOnnx;
  SkipEstimatorOptions cv_opt;
  cv_opt.depthwise = SkipConvKernel::kOpenCv;
  cv_opt.pointwise = SkipConvKernel::kOpenCv;
  auto plain = SkipEstimator::load(kOnnx, cv_opt);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->ferry_depthwise_layers(), 0);
  EXPECT_EQ(plain->ferry_pointwise_layers(), 0);
  std::vector<cv::Mat> frames;
  for (int i = 0; i < 4; ++i) frames.push_back(synthetic_rgb(i));
  std::mt19937 rng(6);
  for (const int side : {128, 97, 300}) {
    cv::Mat img(side, side + 13, CV_8UC3);
    cv::randu(img, 0, 256);
    frames.push_back(img);
  }
  std::vector<float> want;
  for (const cv::Mat& f : frames) {
    auto b = plain->score(f);
    ASSERT_TRUE(b.ok());
    want.push_back(*b);
  }
  for (const auto& [dw, pw] : {std::pair{true, false}, {false, true}, {true, true}}) {
    SkipEstimatorOptions opt;
    opt.depthwise = dw ? SkipConvKernel::kFerryKernel : SkipConvKernel::kOpenCv;
    opt.pointwise = pw ? SkipConvKernel::kFerryKernel : SkipConvKernel::kOpenCv;
    auto fast = SkipEstimator::load(kOnnx, opt);
    ASSERT_TRUE(fast.ok()) << fast.status().to_string();
    EXPECT_EQ(fast->ferry_depthwise_layers(), dw ? 13 : 0);
    EXPECT_EQ(fast->ferry_pointwise_layers(), pw ? 25 : 0);
    int differing = 0;
    for (std::size_t i = 0; i < frames.size(); ++i) {
      auto a = fast->score(frames[i]);
      ASSERT_TRUE(a.ok());
      EXPECT_NEAR(*a, want[i], 1e-5 * std::max(1.0f, std::abs(want[i])))
          << "frame " << i << " dw=" << dw << " pw=" << pw;
      differing += *a != want[i];
    }
    // Different summation order: bit-identical scores on every frame would mean the kernels are
    // not in the path at all.
    EXPECT_GT(differing, 0) << "dw=" << dw << " pw=" << pw;
  }
  // The scope is over: a plain readNetFromONNX gets OpenCV's layers again.
  cv::dnn::Net net = cv::dnn::readNetFromONNX(kOnnx);
  int own_convs = 0;
  for (const auto& name : net.getLayerNames()) {
    cv::Ptr<cv::dnn::Layer> l = net.getLayer(name);
    own_convs += l->type == "Convolution" && l.dynamicCast<cv::dnn::ConvolutionLayer>().empty();
  }
  EXPECT_EQ(own_convs, 0);
}

TEST(RouteOnnxEstimator, EnvSelectsTheRuntimePerKind) {
  if (!std::filesystem::exists(kOnnx)) GTEST_SKIP() << "SKIPPED: no " << kOnnx;
  const auto load_with = [](const char* dw, const char* pw, SkipEstimatorOptions opt = {}) {
    ScopedEnv e1("FERRY_ROUTE_DW", dw), e2("FERRY_ROUTE_PW", pw);
    return SkipEstimator::load(kOnnx, opt);
  };
  auto none = load_with("opencv", "opencv");
  auto dw_only = load_with("ferry", "opencv");
  auto pw_only = load_with("opencv", nullptr);
  auto both = load_with(nullptr, "ferry");
  ASSERT_TRUE(none.ok() && dw_only.ok() && pw_only.ok() && both.ok());
  EXPECT_EQ(none->ferry_depthwise_layers() + none->ferry_pointwise_layers(), 0);
  EXPECT_EQ(dw_only->ferry_depthwise_layers(), 13);
  EXPECT_EQ(dw_only->ferry_pointwise_layers(), 0);
  EXPECT_EQ(pw_only->ferry_depthwise_layers(), 0);
  EXPECT_EQ(pw_only->ferry_pointwise_layers(), 25);
  EXPECT_EQ(both->ferry_depthwise_layers(), 13);
  EXPECT_EQ(both->ferry_pointwise_layers(), 25);
  EXPECT_EQ(load_with("fast", nullptr).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(load_with(nullptr, "fast").status().code(), StatusCode::kInvalidArgument);
  SkipEstimatorOptions explicit_opt;  // an explicit option wins over the environment
  explicit_opt.depthwise = SkipConvKernel::kFerryKernel;
  explicit_opt.pointwise = SkipConvKernel::kFerryKernel;
  auto d = load_with("opencv", "opencv", explicit_opt);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->ferry_depthwise_layers(), 13);
  EXPECT_EQ(d->ferry_pointwise_layers(), 25);
}

// Pixel (R, G, B) = (255, 0, 128) -> ((1 − 0.485)/0.229, (0 − 0.456)/0.224,
// (128/255 − 0.406)/0.225) in planes 0, 1, 2.
TEST(RouteOnnxEstimator, PreprocessIsRgbNchwNormalised) {
  if (!std::filesystem::exists(kOnnx)) GTEST_SKIP() << "SKIPPED: no " << kOnnx;
  auto est = SkipEstimator::load(kOnnx);
  ASSERT_TRUE(est.ok());
  cv::Mat bgr(128, 128, CV_8UC3, cv::Scalar(128, 0, 255));
  auto blob = est->preprocess(bgr);
  ASSERT_TRUE(blob.ok());
  ASSERT_EQ(blob->total(), 3u * 128 * 128);
  const float* p = blob->ptr<float>();
  EXPECT_NEAR(p[0], (1 - 0.485f) / 0.229f, 1e-6);
  EXPECT_NEAR(p[128 * 128 + 77], (0 - 0.456f) / 0.224f, 1e-6);
  EXPECT_NEAR(p[2 * 128 * 128 + 5000], (128 / 255.0f - 0.406f) / 0.225f, 1e-6);
}

TEST(RouteOnnxEstimator, BadInputIsAStatus) {
  EXPECT_EQ(SkipEstimator::load("/nonexistent.onnx").status().code(), StatusCode::kNotFound);
  const auto junk = std::filesystem::temp_directory_path() / "ferry_route_junk.onnx";
  std::ofstream(junk) << "this is not a protobuf";
  EXPECT_EQ(SkipEstimator::load(junk.string()).status().code(), StatusCode::kCorrupt);
  std::filesystem::remove(junk);
  SkipEstimatorOptions bad;
  bad.std[1] = 0;
  EXPECT_EQ(SkipEstimator::load(kOnnx, bad).status().code(), StatusCode::kInvalidArgument);
  if (!std::filesystem::exists(kOnnx)) return;
  auto est = SkipEstimator::load(kOnnx);
  ASSERT_TRUE(est.ok());
  EXPECT_EQ(est->score(cv::Mat()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(est->score(cv::Mat(64, 64, CV_8UC1, cv::Scalar(0))).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(est->score(cv::Mat(64, 64, CV_32FC3, cv::Scalar(0))).status().code(),
            StatusCode::kInvalidArgument);
  // Small images are enlarged, not rejected.
  EXPECT_TRUE(est->score(cv::Mat(3, 5, CV_8UC3, cv::Scalar(10, 20, 30))).ok());
}

}  // namespace
}  // namespace ferry::route
