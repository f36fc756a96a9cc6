// SPDX-License-Identifier: Apache-2.0
// Latency of the route estimators on one CPU core: the ONNX skip estimator at 128x128 through
// OpenCV DNN (cv::setNumThreads(1); target <= 3 ms per frame, route.md "pixel estimator <= 3 ms per
// frame on one CPU core"), including preprocessing, and the conditioned XGBoost walker with its 21
// features. Models come from tests/data/route/.
// The BM_SkipForward* cases take the estimator apart to find where the time goes and what
// OpenCV DNN settings buy (docs/route_estimators.md "Latency"): forward alone on a prepared blob,
// per batch of frames (per-frame time = time / `batch`), with layer fusion off (the
// default is on), with 2 threads (not the target; for reference), and the share of convolution
// time in depthwise, pointwise and the first full 3x3 convolution (getPerfProfile); `ferry` picks
// which convolutions run on ferry's kernels through route/conv_layer_scope.h (0: none, OpenCV 4.6
// alone; 1: depthwise 3x3 only; 2: depthwise and pointwise 1x1, the estimator's default).
// BM_SkipForwardFerry runs the three nets in one process, alternating frame by frame so load
// changes on the shared machine hit all alike, and reports the median per-frame time of each
// (wall and this thread's CPU time) and the ratios OpenCV-only / ferry.
// BM_PointwiseLayers times ferry's pointwise kernel (each ISA) on the net's 1x1 shapes.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>
#include <random>
#include <string>

#include <benchmark/benchmark.h>
#include <cblas.h>  // OpenBLAS (linked through ferry_kernels), for the sgemm comparison
#include <opencv2/core.hpp>
#include <opencv2/dnn.hpp>

#include "route/conv_layer_scope.h"
#include "route/features.h"
#include "route/onnx_estimator.h"
#include "route/pointwise_conv.h"
#include "route/xgboost_model.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace {

// FERRY_ROUTE_DATA, else <repo>/tests/data/route/ found from this file's path.
std::string data_dir() {
  if (const char* env = std::getenv("FERRY_ROUTE_DATA")) return std::string(env) + "/";
  const std::string f = __FILE__;
  const auto pos = f.rfind("bench/route/");
  return (pos == std::string::npos ? std::string() : f.substr(0, pos)) + "tests/data/route/";
}
std::string model_path() { return data_dir() + "skip_mobilenet_v2_offloadbin.onnx"; }

ferry::route::SkipConvKernel kernel(bool ferry) {
  return ferry ? ferry::route::SkipConvKernel::kFerryKernel : ferry::route::SkipConvKernel::kOpenCv;
}

// args = {image side, ferry}: ferry 0 = OpenCV-only, 1 = ferry's depthwise kernel, 2 = ferry's
// depthwise and pointwise kernels (the default).
void BM_SkipEstimator128(benchmark::State& state) {
  cv::setNumThreads(1);
  ferry::route::SkipEstimatorOptions opt;
  opt.depthwise = kernel(state.range(1) >= 1);
  opt.pointwise = kernel(state.range(1) >= 2);
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
    ->ArgNames({"side", "ferry"})
    ->ArgsProduct({{128, 500}, {0, 1, 2}})
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

// The net as SkipEstimator::load builds it; ferry: 0 = OpenCV only, 1 = depthwise convolutions on
// ferry's kernel, 2 = depthwise and pointwise.
cv::dnn::Net read_net(int ferry) {
  std::optional<ferry::route::ScopedFerryConvLayers> scope;
  if (ferry > 0)
    scope.emplace(ferry::route::FerryConvKinds{.depthwise = true, .pointwise = ferry > 1});
  cv::dnn::Net net = cv::dnn::readNetFromONNX(model_path());
  net.setPreferableBackend(cv::dnn::DNN_BACKEND_OPENCV);
  net.setPreferableTarget(cv::dnn::DNN_TARGET_CPU);
  return net;
}

// Forward only: args = {batch, threads, fusion, ferry}.
void BM_SkipForward(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  cv::setNumThreads(static_cast<int>(state.range(1)));
  cv::dnn::Net net = read_net(static_cast<int>(state.range(3)));
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
    ->ArgNames({"batch", "threads", "fusion", "ferry"})
    ->Args({1, 1, 1, 0})
    ->Args({1, 1, 1, 1})
    ->Args({1, 1, 1, 2})
    ->Args({1, 1, 0, 0})
    ->Args({1, 1, 0, 2})
    ->Args({4, 1, 1, 0})
    ->Args({4, 1, 1, 2})
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

// One core, batch 1, fusion on: OpenCV-only vs ferry's depthwise kernel vs ferry's depthwise and
// pointwise kernels, one forward of each per iteration (the iteration time is the sum of all
// three). Counters: median ms per frame of each, wall and thread CPU, and the ratios
// opencv / ferry (both kernels) and opencv / dw-only.
void BM_SkipForwardFerry(benchmark::State& state) {
  cv::setNumThreads(1);
  constexpr int kNets = 3;
  cv::dnn::Net nets[kNets] = {read_net(0), read_net(1), read_net(2)};
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
  std::vector<double> wall[kNets], cpu[kNets];
  for (auto _ : state) {
    for (int k = 0; k < kNets; ++k) {
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
  const char* names[kNets] = {"opencv", "ferry_dw", "ferry"};
  for (int k = 0; k < kNets; ++k) {
    state.counters[std::string(names[k]) + "_wall_ms"] = median(wall[k]);
    state.counters[std::string(names[k]) + "_cpu_ms"] = median(cpu[k]);
  }
  state.counters["ratio_wall"] = median(wall[0]) / median(wall[2]);
  state.counters["ratio_cpu"] = median(cpu[0]) / median(cpu[2]);
  state.counters["ratio_dw_only_cpu"] = median(cpu[0]) / median(cpu[1]);
}
BENCHMARK(BM_SkipForwardFerry)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// The pointwise convolution through OpenBLAS: out = W [C_out, C_in] x in [C_in, P], then bias and
// clamp in a second pass over the output.
void sgemm_bias_clamp(const ferry::route::PointwiseConvArgs& a, const float* weight) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, a.out_channels, a.pixels, a.in_channels,
              1.0f, weight, a.in_channels, a.in, a.pixels, 0.0f, a.out, a.pixels);
  for (int co = 0; co < a.out_channels; ++co) {
    float* o = a.out + static_cast<std::size_t>(co) * a.pixels;
    for (int p = 0; p < a.pixels; ++p) {
      o[p] = std::min(std::max(o[p] + a.bias[co], a.clamp_min), a.clamp_max);
    }
  }
}

// Ferry's pointwise kernel alone on the skip estimator's 1x1 shapes, weighted by how often each
// occurs in the net: one iteration = all 25 pointwise layers of one forward. args = {isa}: 0
// scalar, 1 AVX2, 2 AVX-512 (skipped where the CPU lacks it), 3 OpenBLAS cblas_sgemm on one
// thread (the other option issue #6 names; C = W [C_out, C_in] x X [C_in, P], then a bias + clamp
// pass). Counter GMAC_per_s over the 58.7 M multiply-adds.
void BM_PointwiseLayers(benchmark::State& state) {
  struct Shape {
    int c_out, c_in, pixels, count;
  };
  static constexpr Shape kShapes[] = {{16, 32, 4096, 1},  {96, 16, 4096, 1},  {24, 96, 1024, 1},
                                      {144, 24, 1024, 2}, {24, 144, 1024, 1}, {32, 144, 256, 1},
                                      {192, 32, 256, 3},  {32, 192, 256, 2},  {64, 192, 64, 1},
                                      {384, 64, 64, 4},   {64, 384, 64, 3},   {96, 384, 64, 1},
                                      {576, 96, 64, 2},   {96, 576, 64, 2}};
  const int isa = static_cast<int>(state.range(0));
  openblas_set_num_threads(1);
  if ((isa == 1 && !ferry::route::pointwise_conv_have_avx2()) ||
      (isa == 2 && !ferry::route::pointwise_conv_have_avx512())) {
    state.SkipWithError("cpu lacks this isa");
    return;
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> in, w, wt, bias, out;
  double macs = 0;
  for (const Shape& s : kShapes) {
    auto fill = [&](std::size_t n) {
      std::vector<float> v(n);
      for (auto& x : v) x = nd(rng);
      return v;
    };
    in.push_back(fill(static_cast<std::size_t>(s.c_in) * s.pixels));
    w.push_back(fill(static_cast<std::size_t>(s.c_in) * s.c_out));
    wt.emplace_back(w.back().size());
    ferry::route::pointwise_conv_transpose_weights(w.back().data(), s.c_out, s.c_in,
                                                   wt.back().data());
    bias.push_back(fill(static_cast<std::size_t>(s.c_out)));
    out.emplace_back(static_cast<std::size_t>(s.c_out) * s.pixels);
    macs += static_cast<double>(s.c_out) * s.c_in * s.pixels * s.count;
  }
  auto run_all = [&] {
    for (std::size_t i = 0; i < std::size(kShapes); ++i) {
      ferry::route::PointwiseConvArgs a;
      a.in = in[i].data();
      a.weight_t = wt[i].data();
      a.bias = bias[i].data();
      a.out = out[i].data();
      a.in_channels = kShapes[i].c_in;
      a.out_channels = kShapes[i].c_out;
      a.pixels = kShapes[i].pixels;
      a.clamp_min = 0.0f;
      a.clamp_max = 6.0f;
      for (int k = 0; k < kShapes[i].count; ++k) {
        if (isa == 0) ferry::route::pointwise_conv_scalar(a);
        if (isa == 1) ferry::route::pointwise_conv_avx2(a);
        if (isa == 2) ferry::route::pointwise_conv_avx512(a);
        if (isa == 3) sgemm_bias_clamp(a, w[i].data());
      }
    }
  };
  run_all();
  for (auto _ : state) {
    run_all();
    benchmark::DoNotOptimize(out[0].data());
  }
  state.counters["GMAC_per_s"] =
      benchmark::Counter(macs * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PointwiseLayers)->ArgName("isa")->DenseRange(0, 3)->Unit(benchmark::kMillisecond);

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
