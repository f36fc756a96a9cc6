// SPDX-License-Identifier: Apache-2.0
// Latency of the route estimators on one CPU core: the ONNX skip estimator at 128x128 through
// OpenCV DNN (cv::setNumThreads(1); target <= 3 ms per frame), including preprocessing, and the
// conditioned XGBoost walker with its 21 features. Models come from tests/data/route/.
#include <cstdlib>
#include <random>
#include <string>

#include <benchmark/benchmark.h>
#include <opencv2/core.hpp>

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

void BM_SkipEstimator128(benchmark::State& state) {
  cv::setNumThreads(1);
  auto est = ferry::route::SkipEstimator::load(data_dir() + "skip_mobilenet_v2_offloadbin.onnx");
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
