// SPDX-License-Identifier: Apache-2.0
// cpu_expert_ffn_bench: the cpu-experts mode's CPU expert arithmetic, the exact kernel
// (expert_ffn_row per routed row, split over the thread pool by rows, as the CUDA engine's
// cpu-experts ran it before expert_ffn_fast.h) against the fast one (ExpertFfnGrouped), in the same
// process, on the Qwen3-30B-A3B expert shape (C 2048, F 768, top-8) with distinct weights for
// every layer, so a pass over the layers streams its expert bytes from DRAM, not from cache:
// 48 layers x 8 experts x 9.4 MiB (bf16) = 3.6 GB per pass. One pass = one decode token's
// routed experts (T = 1) or a T-token step where every token routes to the layer's 8 experts.
// Prints GB/s of expert bytes (bytes of the routed experts' weights / pass time), the implied
// expert-only tokens/s, the fast/exact ratio and the largest difference between the two, beside a
// read-only pass over the same bytes with the same pool (the DRAM roofline here); states the
// machine (CPU model, hardware threads, the pool's threads, the SIMD variant).
//   cpu_expert_ffn_bench [--layers 48] [--top-k 8] [--hidden 2048] [--width 768] [--tokens 1]
//                        [--dtype bf16|f32] [--passes 5] [--exact-passes 2] [--json FILE]
// FERRY_NUM_THREADS sets the pool's size (default: every hardware thread); FERRY_CPU_ISA lowers
// the SIMD variant (scalar, avx2).
#include <sys/utsname.h>

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/cpu_info.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "serve/expert_ffn.h"
#include "serve/expert_ffn_fast.h"

namespace {

using ferry::DType;
using ferry::serve::ExpertRef;

// A cheap, seedable value in [-scale, scale) per index (splitmix64): fills GBs in parallel.
float value_at(std::uint64_t i, float scale) {
  std::uint64_t z = i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (float(z >> 40) / float(1 << 24) * 2.0f - 1.0f) * scale;
}

// The exact kernel as the executor runs it (expert_executor.cpp compute_rows).
void run_exact(const std::vector<ExpertRef>& refs, const std::int32_t* ids, std::int64_t rows,
               int K, const float* x, float* out, std::int64_t C, std::int64_t F) {
  ferry::ThreadPool::global().parallel_for(
      static_cast<std::size_t>(rows),
      [&](std::size_t b, std::size_t e) {
        thread_local std::vector<float> scratch;
        if (static_cast<std::int64_t>(scratch.size()) < F) scratch.resize(std::size_t(F));
        for (std::size_t r = b; r < e; ++r) {
          const std::int64_t i = std::int64_t(r), t = i / K;
          ferry::serve::expert_ffn_row(refs[std::size_t(ids[i])], x + t * C, out + i * C, C, F,
                                       scratch.data());
        }
      },
      2);
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 48, K = 8, T = 1, passes = 5, exact_passes = 2;
  std::int64_t C = 2048, F = 768;
  std::string dtype = "bf16", json_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--layers")
      layers = std::atoi(v);
    else if (a == "--top-k")
      K = std::atoi(v);
    else if (a == "--hidden")
      C = std::atoll(v);
    else if (a == "--width")
      F = std::atoll(v);
    else if (a == "--tokens")
      T = std::atoi(v);
    else if (a == "--dtype")
      dtype = v;
    else if (a == "--passes")
      passes = std::atoi(v);
    else if (a == "--exact-passes")
      exact_passes = std::atoi(v);
    else if (a == "--json")
      json_path = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (layers < 1 || K < 1 || T < 1 || C < 1 || F < 1 || passes < 1 || exact_passes < 0 ||
      (dtype != "bf16" && dtype != "f32")) {
    std::fprintf(stderr, "bad arguments (dtype bf16|f32, positive sizes)\n");
    return 2;
  }
  const DType dt = dtype == "bf16" ? DType::kBF16 : DType::kF32;
  const std::size_t es = ferry::dtype_size(dt);
  const std::size_t mat = std::size_t(F * C), expert_elems = 3 * mat;
  const std::size_t expert_bytes = expert_elems * es;
  const std::size_t experts = std::size_t(layers) * std::size_t(K);
  const std::size_t pass_bytes = experts * expert_bytes;

  // Every layer's K experts, packed like the host store ([gate | up | down] per expert).
  std::vector<std::byte> store(experts * expert_bytes);
  const float sg = 2.0f / std::sqrt(float(C)), sd = 2.0f / std::sqrt(float(F));
  ferry::parallel_items(experts, 0, [&](std::size_t j) {
    std::byte* base = store.data() + j * expert_bytes;
    for (std::size_t i = 0; i < expert_elems; ++i) {
      const float v = value_at(j * expert_elems + i, i < 2 * mat ? sg : sd);
      if (dt == DType::kBF16) {
        const std::uint16_t b = ferry::f32_to_bf16(v);
        std::memcpy(base + i * 2, &b, 2);
      } else {
        std::memcpy(base + i * 4, &v, 4);
      }
    }
  });
  // refs[l][k]: layer l's expert k; routing: every token of the step to all K experts.
  std::vector<std::vector<ExpertRef>> refs(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    for (int k = 0; k < K; ++k) {
      const std::byte* b =
          store.data() + (std::size_t(l) * std::size_t(K) + std::size_t(k)) * expert_bytes;
      refs[std::size_t(l)].push_back({b, b + mat * es, b + 2 * mat * es, dt});
    }
  }
  const std::int64_t rows = std::int64_t(T) * K;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  std::vector<std::int32_t> row_list(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    ids[std::size_t(i)] = std::int32_t(i % K);
    row_list[std::size_t(i)] = std::int32_t(i);
  }
  std::vector<float> x(std::size_t(std::int64_t(T) * C));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = value_at(1ull << 62 | i, 1.0f);
  std::vector<float> out_exact(std::size_t(rows * C)), out_fast(std::size_t(rows * C));

  ferry::serve::ExpertFfnGrouped fast;
  fast.reserve(rows, F, K);
  auto pass_fast = [&] {
    for (int l = 0; l < layers; ++l) {
      fast.run({.ref_of_expert = refs[std::size_t(l)].data(),
                .ids = ids.data(),
                .rows = row_list.data(),
                .n = rows,
                .x = x.data(),
                .out = out_fast.data(),
                .K = K,
                .E = K,
                .C = C,
                .F = F},
               ferry::ThreadPool::global());
    }
  };
  auto pass_exact = [&] {
    for (int l = 0; l < layers; ++l) {
      run_exact(refs[std::size_t(l)], ids.data(), rows, K, x.data(), out_exact.data(), C, F);
    }
  };
  // The roofline: the same bytes read by the same pool with nothing to compute (a sum of 64-bit
  // words over contiguous chunks), what DRAM delivers to these threads here.
  std::uint64_t sink = 0;
  auto pass_read = [&] {
    const auto* w = reinterpret_cast<const std::uint64_t*>(store.data());
    const std::size_t words = store.size() / 8;
    std::vector<std::uint64_t> part(ferry::ThreadPool::global().size() + 1, 0);
    ferry::ThreadPool::global().parallel_for(
        words,
        [&](std::size_t b, std::size_t e) {
          std::uint64_t acc = 0;
          for (std::size_t i = b; i < e; ++i) acc += w[i];
          part[b / ((words + part.size() - 1) / part.size())] += acc;
        },
        1 << 16);
    for (std::uint64_t v : part) sink += v;
  };
  // Timed passes (after one untimed warm-up pass each): best and mean.
  // Also the process CPU seconds of each pass: on a shared machine the wall time includes other
  // processes' time slices, the CPU time does not (GB per CPU-second ~ per-core throughput).
  std::vector<double> cpu_s_of;  // filled by time_passes, read right after it
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
  };
  auto time_passes = [&](int n, auto&& pass) {
    std::vector<double> s;
    cpu_s_of.clear();
    pass();
    for (int i = 0; i < n; ++i) {
      const double c0 = cpu_now();
      ferry::Timer t;
      pass();
      s.push_back(t.elapsed_s());
      cpu_s_of.push_back(cpu_now() - c0);
    }
    return s;
  };
  auto summary = [&](const std::vector<double>& s, const std::vector<double>& cpu) {
    nlohmann::json j;
    if (s.empty()) return j;
    double cpu_best = *std::min_element(cpu.begin(), cpu.end());
    j["cpu_s_best"] = cpu_best;
    j["gb_per_cpu_s_best"] = double(pass_bytes) / cpu_best / 1e9;
    double best = *std::min_element(s.begin(), s.end()), mean = 0;
    for (double v : s) mean += v / double(s.size());
    j["passes"] = s.size();
    j["best_s"] = best;
    j["mean_s"] = mean;
    j["gbps_best"] = double(pass_bytes) / best / 1e9;
    j["gbps_mean"] = double(pass_bytes) / mean / 1e9;
    j["expert_tokens_per_s_best"] = double(T) / best;  // experts only: no attention, no GPU
    return j;
  };
  const std::vector<double> rs = time_passes(passes, pass_read);
  const std::vector<double> rs_cpu = cpu_s_of;
  const std::vector<double> fs = time_passes(passes, pass_fast);
  const std::vector<double> fs_cpu = cpu_s_of;
  const std::vector<double> xs =
      exact_passes > 0 ? time_passes(exact_passes, pass_exact) : std::vector<double>{};
  const std::vector<double> xs_cpu = exact_passes > 0 ? cpu_s_of : std::vector<double>{};
  // The two kernels on the last layer's step: the largest difference (summation order only).
  double max_diff = 0, max_abs = 0;
  if (exact_passes > 0) {
    for (std::size_t i = 0; i < out_fast.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(double(out_fast[i]) - double(out_exact[i])));
      max_abs = std::max(max_abs, std::fabs(double(out_exact[i])));
    }
  }

  utsname un{};
  uname(&un);
  const unsigned hw = std::thread::hardware_concurrency();
  const std::size_t pool_threads = ferry::ThreadPool::global().size() + 1;
  nlohmann::json j;
  j["what"] =
      "cpu-experts CPU expert FFN: exact (expert_ffn_row per row) vs fast (ExpertFfnGrouped), "
      "distinct weights per layer (DRAM-streaming); GB/s = routed experts' weight bytes / pass";
  j["machine"] = {{"cpu", ferry::cpu_model_name()},
                  {"hardware_threads", hw},
                  {"pool_threads", pool_threads},
                  {"isa", std::string(ferry::kernels::cpu::to_string(fast.isa()))},
                  {"os", std::string(un.sysname) + " " + un.release}};
  j["shape"] = {{"hidden", C},
                {"width", F},
                {"top_k", K},
                {"layers", layers},
                {"tokens", T},
                {"dtype", dtype},
                {"expert_bytes", expert_bytes},
                {"pass_bytes", pass_bytes}};
  j["read_only"] = summary(rs, rs_cpu);
  j["read_only"].erase("expert_tokens_per_s_best");
  j["read_only"]["checksum"] = sink;  // keeps the reads
  j["fast"] = summary(fs, fs_cpu);
  j["exact"] = summary(xs, xs_cpu);
  if (exact_passes > 0) {
    const double ratio = j["exact"]["best_s"].get<double>() / j["fast"]["best_s"].get<double>();
    j["fast_over_exact"] = ratio;
    j["max_abs_diff"] = max_diff;
    j["max_abs_exact"] = max_abs;
  }
  std::printf(
      "cpu expert FFN, %s experts %lld x %lld, top-%d, %d layers x %d distinct experts = %.2f GB "
      "per pass, %d token(s) per step\n",
      dtype.c_str(), static_cast<long long>(F), static_cast<long long>(C), K, layers, K,
      double(pass_bytes) / 1e9, T);
  std::printf("machine: %s, %u hardware threads, pool %zu threads, isa %s (%s %s)\n",
              ferry::cpu_model_name().c_str(), hw, pool_threads,
              std::string(ferry::kernels::cpu::to_string(fast.isa())).c_str(), un.sysname,
              un.release);
  std::printf(
      "read : best %.3f s/pass  %.2f GB/s  (mean %.2f GB/s)  %.2f GB/CPU-s  the same bytes, no "
      "compute\n",
      j["read_only"]["best_s"].get<double>(), j["read_only"]["gbps_best"].get<double>(),
      j["read_only"]["gbps_mean"].get<double>(), j["read_only"]["gb_per_cpu_s_best"].get<double>());
  std::printf(
      "fast : best %.3f s/pass  %.2f GB/s  (mean %.2f GB/s)  %.2f GB/CPU-s  %.2f expert-only "
      "tok/s\n",
      j["fast"]["best_s"].get<double>(), j["fast"]["gbps_best"].get<double>(),
      j["fast"]["gbps_mean"].get<double>(), j["fast"]["gb_per_cpu_s_best"].get<double>(),
      j["fast"]["expert_tokens_per_s_best"].get<double>());
  if (exact_passes > 0) {
    std::printf(
        "exact: best %.3f s/pass  %.2f GB/s  (mean %.2f GB/s)  %.2f GB/CPU-s  %.2f expert-only "
        "tok/s\n",
        j["exact"]["best_s"].get<double>(), j["exact"]["gbps_best"].get<double>(),
        j["exact"]["gbps_mean"].get<double>(), j["exact"]["gb_per_cpu_s_best"].get<double>(),
        j["exact"]["expert_tokens_per_s_best"].get<double>());
    std::printf("fast/exact %.2fx; max |fast - exact| %.3g (max |exact| %.3g)\n",
                j["fast_over_exact"].get<double>(), max_diff, max_abs);
  }
  if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
  return 0;
}
