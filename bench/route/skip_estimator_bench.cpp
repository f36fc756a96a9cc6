// SPDX-License-Identifier: Apache-2.0
// Latency of the route estimators on one CPU core: the ONNX skip estimator at 128x128 through
// OpenCV DNN (cv::setNumThreads(1); target <= 3 ms per frame, route.md "pixel estimator <= 3 ms per
// frame on one CPU core"), including preprocessing, and the conditioned XGBoost walker with its 21
// features. Models come from tests/data/route/.
// The BM_SkipForward* cases take the estimator apart to find where the time goes and what
// OpenCV DNN settings buy (docs/route_estimators.md "Latency"): forward alone on a prepared blob,
// per batch of frames (per-frame time = time / `batch`), with layer fusion off (the
// default is on), with 2 threads (not the target; for reference), and the share of convolution
// time in depthwise, pointwise and the first full 3x3 convolution (getPerfProfile); `dw` picks who
// runs the depthwise convolutions (0: OpenCV 4.6's own layer, 1: ferry's kernel through
// route/depthwise_conv_layer.h, the estimator's default).
// BM_SkipForwardDepthwise runs both nets in one process, alternating frame by frame so load
// changes on the shared machine hit both alike, and reports the median per-frame time of each
// (wall and this thread's CPU time) and their ratio.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>
#include <random>
#include <string>

#include <benchmark/benchmark.h>
#include <opencv2/core.hpp>
#include <opencv2/dnn.hpp>

#include "route/depthwise_conv_layer.h"
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

// args = {image side, dw}: dw 0 = OpenCV-only, 1 = ferry's depthwise kernel (the default).
void BM_SkipEstimator128(benchmark::State& state) {
  cv::setNumThreads(1);
  ferry::route::SkipEstimatorOptions opt;
  opt.depthwise = state.range(1) != 0 ? ferry::route::SkipDepthwise::kFerryKernel
                                      : ferry::route::SkipDepthwise::kOpenCv;
  auto est = ferry::route::SkipEstimator::load(model_path(), opt);
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
BENCHMARK(BM_SkipEstimator128)
    ->ArgNames({"side", "dw"})
    ->ArgsProduct({{128, 500}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

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

// The net as SkipEstimator::load builds it; ferry_dw: depthwise convolutions on ferry's kernel.
cv::dnn::Net read_net(bool ferry_dw) {
  std::optional<ferry::route::ScopedDepthwiseConvLayer> dw;
  if (ferry_dw) dw.emplace();
  cv::dnn::Net net = cv::dnn::readNetFromONNX(model_path());
  net.setPreferableBackend(cv::dnn::DNN_BACKEND_OPENCV);
  net.setPreferableTarget(cv::dnn::DNN_TARGET_CPU);
  return net;
}

// Forward only: args = {batch, threads, fusion, dw}.
void BM_SkipForward(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  cv::setNumThreads(static_cast<int>(state.range(1)));
  cv::dnn::Net net = read_net(state.range(3) != 0);
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
    ->ArgNames({"batch", "threads", "fusion", "dw"})
    ->Args({1, 1, 1, 0})
    ->Args({1, 1, 1, 1})
    ->Args({1, 1, 0, 0})
    ->Args({1, 1, 0, 1})
    ->Args({4, 1, 1, 0})
    ->Args({4, 1, 1, 1})
    ->Args({1, 2, 1, 0})
    ->Unit(benchmark::kMillisecond);

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One core, batch 1, fusion on: OpenCV-only vs ferry's depthwise kernel, one forward of each per
// iteration (the iteration time is the sum of both). Counters: median ms per frame of each,
// wall and thread CPU, and opencv / ferry ratios.
void BM_SkipForwardDepthwise(benchmark::State& state) {
  cv::setNumThreads(1);
  cv::dnn::Net nets[2] = {read_net(false), read_net(true)};  // 0: OpenCV, 1: ferry kernel
  const int shape[4] = {1, 3, 128, 128};
  cv::Mat blob(4, shape, CV_32F);
  cv::randn(blob, 0, 1);
  try {
    for (auto& net : nets) {
      net.setInput(blob);
      for (int i = 0; i < 3; ++i) net.forward();
    }
  } catch (const cv::Exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  std::vector<double> wall[2], cpu[2];
  for (auto _ : state) {
    for (int k = 0; k < 2; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = thread_cpu_ms();
      nets[k].setInput(blob);
      cv::Mat out = nets[k].forward();
      benchmark::DoNotOptimize(out.data);
      cpu[k].push_back(thread_cpu_ms() - c0);
      wall[k].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  state.counters["opencv_wall_ms"] = median(wall[0]);
  state.counters["ferry_wall_ms"] = median(wall[1]);
  state.counters["opencv_cpu_ms"] = median(cpu[0]);
  state.counters["ferry_cpu_ms"] = median(cpu[1]);
  state.counters["ratio_wall"] = median(wall[0]) / median(wall[1]);
  state.counters["ratio_cpu"] = median(cpu[0]) / median(cpu[1]);
}
BENCHMARK(BM_SkipForwardDepthwise)->Unit(benchmark::kMillisecond)->MinTime(2.0);

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
