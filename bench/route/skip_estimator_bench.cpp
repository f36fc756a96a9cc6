// SPDX-License-Identifier: Apache-2.0
// Latency of the route estimators on one CPU core: the ONNX skip estimator at 128x128 through
// OpenCV DNN (cv::setNumThreads(1); target <= 3 ms per frame, route.md "pixel estimator <= 3 ms per
// frame on one CPU core"), including preprocessing, and the conditioned XGBoost walker with its 21
// features. Models come from tests/data/route/.
// The BM_SkipForward* cases take the estimator apart to find where the time goes and what
// OpenCV DNN settings buy (docs/route_estimators.md "Latency"): forward alone on a prepared blob,
// per batch of frames (per-frame time = time / `batch`), with layer fusion off (the
// default is on), with 2 threads (not the target; for reference), and the share of convolution
// time in depthwise, pointwise and the first full 3x3 convolution (getPerfProfile).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <string>

#include <benchmark/benchmark.h>
#include <opencv2/core.hpp>
#include <opencv2/dnn.hpp>

#include "route/features.h"
#include "route/onnx_estimator.h"
#include "route/xgboost_model.h"

namespace {

// FERRY_ROUTE_DATA, else <repo>/tests/data/route/ found from this file's path.
std::string data_dir() {
  if (const char* env = std::getenv("FERRY_ROUTE_DATA")) return std::string(env) + "/";
  const std::string f = __FILE__;
  const auto pos = f.rfind("bench/route/");
  return (pos == std::string::npos ? std::string() : f.substr(0, pos)) + "tests/data/route/";
}
std::string model_path() { return data_dir() + "skip_mobilenet_v2_offloadbin.onnx"; }

void BM_SkipEstimator128(benchmark::State& state) {
  cv::setNumThreads(1);
  auto est = ferry::route::SkipEstimator::load(model_path());
  if (!est.ok()) {
    state.SkipWithError(est.status().to_string().c_str());
    return;
  }
  cv::Mat img(static_cast<int>(state.range(0)), static_cast<int>(state.range(0)), CV_8UC3);
  cv::randu(img, 0, 255);
  for (int i = 0; i < 3; ++i) (void)est->score(img);  // warm-up
  for (auto _ : state) {
    auto s = est->score(img);
    benchmark::DoNotOptimize(s);
  }
}
BENCHMARK(BM_SkipEstimator128)->Arg(128)->Arg(500)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_SkipPreprocess(benchmark::State& state) {
  auto est = ferry::route::SkipEstimator::load(model_path());
  if (!est.ok()) {
    state.SkipWithError(est.status().to_string().c_str());
    return;
  }
  cv::Mat img(128, 128, CV_8UC3);
  cv::randu(img, 0, 255);
  for (auto _ : state) {
    auto b = est->preprocess(img);
    benchmark::DoNotOptimize(b);
  }
}
BENCHMARK(BM_SkipPreprocess)->Unit(benchmark::kMillisecond)->UseRealTime();

// Forward only: args = {batch, threads, fusion}.
void BM_SkipForward(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  cv::setNumThreads(static_cast<int>(state.range(1)));
  cv::dnn::Net net = cv::dnn::readNetFromONNX(model_path());
  net.setPreferableBackend(cv::dnn::DNN_BACKEND_OPENCV);
  net.setPreferableTarget(cv::dnn::DNN_TARGET_CPU);
  net.enableFusion(state.range(2) != 0);
  const int shape[4] = {batch, 3, 128, 128};
  cv::Mat blob(4, shape, CV_32F);
  cv::randn(blob, 0, 1);
  net.setInput(blob);
  cv::Mat out;
  try {
    for (int i = 0; i < 3; ++i) out = net.forward();
  } catch (const cv::Exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  if (static_cast<int>(out.total()) != batch) {
    state.SkipWithError("output is not one value per frame");
    return;
  }
  // Per-layer time: the minimum over iterations of getPerfProfile's ticks, so a preemption on the
  // shared machine does not land in one layer's share.
  std::vector<double> t, best;
  for (auto _ : state) {
    net.setInput(blob);
    out = net.forward();
    benchmark::DoNotOptimize(out.data);
    net.getPerfProfile(t);
    if (best.empty()) best = t;
    for (std::size_t i = 0; i < t.size() && i < best.size(); ++i) best[i] = std::min(best[i], t[i]);
  }
  state.counters["batch"] = batch;  // per-frame time = time / batch
  // Where the time goes: convolution kinds by their weight shape.
  std::map<std::string, double> ms;
  const double tick_ms = 1000.0 / cv::getTickFrequency();
  double total = 0;
  for (std::size_t i = 0; i < best.size(); ++i) {
    cv::Ptr<cv::dnn::Layer> l = net.getLayer(static_cast<int>(i) + 1);
    std::string kind = l->type;
    if (kind == "Convolution" && !l->blobs.empty() && l->blobs[0].dims == 4) {
      const cv::MatSize& w = l->blobs[0].size;
      kind = w[2] == 1 ? "conv_pointwise" : (w[1] == 1 ? "conv_depthwise" : "conv_full");
    }
    ms[kind] += best[i] * tick_ms;
    total += best[i] * tick_ms;
  }
  state.counters["layers_min_ms"] = total;
  for (const auto& [k, v] : ms) {
    if (k.rfind("conv", 0) == 0) state.counters["ms_" + k] = v;
  }
}
BENCHMARK(BM_SkipForward)
    ->ArgNames({"batch", "threads", "fusion"})
    ->Args({1, 1, 1})
    ->Args({1, 1, 0})
    ->Args({4, 1, 1})
    ->Args({16, 1, 1})
    ->Args({1, 2, 1})
    ->Unit(benchmark::kMillisecond);

void BM_CondXgboost(benchmark::State& state) {
  auto model = ferry::route::XgbModel::load(data_dir() + "cond_xgboost_moric.model.json");
  if (!model.ok()) {
    state.SkipWithError(model.status().to_string().c_str());
    return;
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<ferry::route::Detection> dets(12);
  for (auto& d : dets) {
    d.score = u(rng);
    d.box = {u(rng) * 400, u(rng) * 300, 10 + u(rng) * 100, 10 + u(rng) * 100};
  }
  for (auto _ : state) {
    auto f = ferry::route::cond_features(dets);
    float x[ferry::route::kNumCondFeatures];
    for (int i = 0; i < ferry::route::kNumCondFeatures; ++i) x[i] = static_cast<float>((*f)[i]);
    benchmark::DoNotOptimize(model->predict_unchecked(x));
  }
}
BENCHMARK(BM_CondXgboost)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
