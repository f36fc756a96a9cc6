// SPDX-License-Identifier: Apache-2.0
// Google Benchmark programs for the CUDA backend, timed with CUDA events (UseManualTime), L2
// flushed (256 MiB memset) before every repetition, rates computed from our own summed event time:
//   BM_Gemm/M/N/K           bf16 x bf16 -> bf16 (y = x W^T), TFLOP/s, Qwen2.5-3B/7B layer shapes,
//                           N(0, 1) operands like torch_baselines.py's torch.randn
//   BM_AttnFwdBwd/S/B/H/G/D/mode causal GQA forward + backward, packed varlen of B sequences of S
//                           (mode: 0 with the backward's workspace, 1 forward only, 2 no workspace,
//                           3 atomic dQ: FERRY_ATTN_BWD_DQ=atomic and its larger workspace)
//   BM_RmsNorm/T/C, BM_SwiGlu/T/F, BM_Add/N, BM_AdamW/N   GB/s of compulsory traffic
//   BM_Copy/bytes           cudaMemcpyAsync device->device: the bandwidth ceiling (GB/s, r+w)
// tools/bench/torch_baselines.py times PyTorch on the same shapes in the same device call, and
// tools/bench/compare.py turns both JSON files into ratios (scripts/gpu_check.sh runs all three).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/backend.h"

namespace {

using namespace ferry;

struct Env {
  kernels::Backend* be = nullptr;
  cudaStream_t raw = nullptr;
  mem::Stream stream;
  void* flush = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  static constexpr std::size_t kFlushBytes = 256u << 20;

  static Env* get(benchmark::State& st) {
    static Env env;
    static bool ok = [] {
      int n = 0;
      if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
      auto be = kernels::cuda_backend(0);
      if (!be.ok()) return false;
      env.be = *be;
      cudaStreamCreateWithFlags(&env.raw, cudaStreamNonBlocking);
      env.stream = mem::Stream(Device::kCuda, 0, env.raw);
      cudaMalloc(&env.flush, kFlushBytes);
      cudaEventCreate(&env.e0);
      cudaEventCreate(&env.e1);
      return true;
    }();
    if (!ok) {
      st.SkipWithError("no CUDA device");
      return nullptr;
    }
    return &env;
  }
  double time_s(const std::function<void()>& f) {
    cudaMemsetAsync(flush, 0, kFlushBytes, raw);
    cudaEventRecord(e0, raw);
    f();
    cudaEventRecord(e1, raw);
    cudaEventSynchronize(e1);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms * 1e-3;
  }
};

// Device buffer filled with small random-ish bf16 values, a 1 Mi-value host pattern repeated:
// a hash (kHash) or N(0, 1) values (kNormal: torch.randn's distribution, which the GEMM rows use
// because a tensor core's power draw, and so the clock under the power limit, depends on the
// operands' bits: on an H100 the same GEMMs ran up to 5 % slower on N(0, 1) than on the hash).
enum class Fill { kHash, kNormal };
struct Dev {
  void* p = nullptr;
  std::size_t bytes = 0;
  Dev(std::size_t n_bytes, std::uint32_t seed, Fill fill = Fill::kHash) : bytes(n_bytes) {
    FERRY_CHECK(cudaMalloc(&p, bytes) == cudaSuccess, "bench: cudaMalloc {} bytes", bytes);
    std::vector<std::uint16_t> h(std::min<std::size_t>(bytes / 2, 1u << 20));
    std::uint32_t x = seed * 2654435761u + 1;
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : h) {
      if (fill == Fill::kNormal) {
        v = f32_to_bf16(normal(rng));
        continue;
      }
      x = x * 1664525u + 1013904223u;
      // bf16 in [-1, 1): sign, exponent 0x7e or below, random mantissa
      v = static_cast<std::uint16_t>(((x >> 16) & 0x807f) | 0x3e00 | ((x >> 8) & 0x80));
    }
    for (std::size_t off = 0; off < bytes; off += h.size() * 2)
      cudaMemcpy(static_cast<char*>(p) + off, h.data(), std::min(h.size() * 2, bytes - off),
                 cudaMemcpyHostToDevice);
    // A pageable upload may still be in flight when cudaMemcpy returns, on the legacy stream,
    // which the benches' non-blocking streams do not wait for.
    cudaDeviceSynchronize();
  }
  ~Dev() { cudaFree(p); }
  TensorView view(DType dt, std::initializer_list<std::int64_t> dims) const {
    return TensorView::contiguous(p, dt, Device::kCuda, dims);
  }
};

void run(benchmark::State& st, Env* env, const std::function<void()>& f, double flops,
         double bytes) {
  f();  // warm-up (cuBLASLt heuristic, workspace)
  cudaStreamSynchronize(env->raw);
  double total = 0.0;
  for (auto _ : st) {
    const double s = env->time_s(f);
    st.SetIterationTime(s);
    total += s;
  }
  const double it = static_cast<double>(st.iterations());
  if (flops > 0) st.counters["TFLOP/s"] = flops * it / total / 1e12;
  if (bytes > 0) st.counters["GB/s"] = bytes * it / total / 1e9;
  st.counters["ms"] = total / it * 1e3;
}

constexpr int kGemmReps = 50;  // = torch_baselines.py's GEMM_REPS

void BM_Gemm(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t m = st.range(0), n = st.range(1), k = st.range(2);
  Dev a(m * k * 2, 1, Fill::kNormal), b(n * k * 2, 2, Fill::kNormal), out(m * n * 2, 3);
  const kernels::GemmArgs args{.out = out.view(DType::kBF16, {m, n}),
                               .a = a.view(DType::kBF16, {m, k}),
                               .b = b.view(DType::kBF16, {n, k}),
                               .trans_b = true};
  // Two more warm-ups than run()'s one: torch_baselines.py's GEMMs get three.
  for (int i = 0; i < 2; ++i) FERRY_CHECK_OK(env->be->gemm(args, env->stream));
  run(
      st, env, [&] { FERRY_CHECK_OK(env->be->gemm(args, env->stream)); }, 2.0 * m * n * k, 0);
}

void BM_AttnFwdBwd(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t s = st.range(0), b = st.range(1), h = st.range(2), g = st.range(3),
                     d = st.range(4), t = s * b;
  Dev q(t * h * d * 2, 4), k(t * g * d * 2, 5), v(t * g * d * 2, 6), o(t * h * d * 2, 7),
      dout(t * h * d * 2, 8), dq(t * h * d * 2, 9), dk(t * g * d * 2, 10), dv(t * g * d * 2, 11),
      lse(h * t * 4, 12), cu((b + 1) * 4, 13);
  std::vector<std::int32_t> hcu(static_cast<std::size_t>(b + 1));
  for (std::int64_t i = 0; i <= b; ++i)
    hcu[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i * s);
  cudaMemcpy(cu.p, hcu.data(), hcu.size() * 4, cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();  // landed before the first launch reads it (see Dev)
  const kernels::AttentionArgs fa{.out = o.view(DType::kBF16, {t, h, d}),
                                  .lse = lse.view(DType::kF32, {h, t}),
                                  .q = q.view(DType::kBF16, {t, h, d}),
                                  .k = k.view(DType::kBF16, {t, g, d}),
                                  .v = v.view(DType::kBF16, {t, g, d}),
                                  .cu_seqlens = cu.view(DType::kI32, {b + 1})};
  kernels::AttentionBackwardArgs ba{.d_q = dq.view(DType::kBF16, {t, h, d}),
                                    .d_k = dk.view(DType::kBF16, {t, g, d}),
                                    .d_v = dv.view(DType::kBF16, {t, g, d}),
                                    .d_out = dout.view(DType::kBF16, {t, h, d}),
                                    .q = fa.q,
                                    .k = fa.k,
                                    .v = fa.v,
                                    .out = fa.out,
                                    .lse = fa.lse,
                                    .cu_seqlens = fa.cu_seqlens};
  // mode 0: forward + backward with the backward's workspace (per-query-head dK/dV slices);
  // 1: forward only; 2: forward + backward without a workspace (the low-memory path); 3: as 0 with
  // FERRY_ATTN_BWD_DQ=atomic (dQ by f32 atomics inside the dK/dV kernel, attention_bwd.cu) set for
  // the whole row — its workspace size and every launch — and restored afterwards. Modes 0-2 run
  // whatever the environment selects (the kernel variants' A/B runs of scripts/gpu_check.sh).
  const std::int64_t mode = st.range(5);
  const bool fwd_only = mode == 1;
  std::optional<std::string> dq_env_old;
  if (mode == 3) {
    if (const char* e = std::getenv("FERRY_ATTN_BWD_DQ"); e != nullptr) dq_env_old = e;
    setenv("FERRY_ATTN_BWD_DQ", "atomic", 1);
  }
  std::size_t ws_bytes = mode == 0 || mode == 3 ? env->be->workspace_bytes(ba) : 0;
  Dev ws(ws_bytes > 0 ? ws_bytes : 16, 0);
  if (ws_bytes > 0) ba.workspace = ws.view(DType::kU8, {static_cast<std::int64_t>(ws_bytes)});
  // causal: forward 2 GEMMs of 2*S*S/2*D each per head; backward 2.5x the forward.
  const double fwd_flops = 2.0 * 2.0 * b * h * (s * s / 2.0) * d;
  run(
      st, env,
      [&] {
        FERRY_CHECK_OK(env->be->attention(fa, env->stream));
        if (!fwd_only) FERRY_CHECK_OK(env->be->attention_backward(ba, env->stream));
      },
      fwd_only ? fwd_flops : 3.5 * fwd_flops, 0);
  if (mode == 3) {
    if (dq_env_old) {
      setenv("FERRY_ATTN_BWD_DQ", dq_env_old->c_str(), 1);
    } else {
      unsetenv("FERRY_ATTN_BWD_DQ");
    }
  }
}

void BM_RmsNorm(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t t = st.range(0), c = st.range(1);
  Dev x(t * c * 2, 14), w(c * 2, 15), y(t * c * 2, 16), r(t * 4, 17);
  const kernels::RmsNormArgs a{.out = y.view(DType::kBF16, {t, c}),
                               .rstd = r.view(DType::kF32, {t}),
                               .in = x.view(DType::kBF16, {t, c}),
                               .weight = w.view(DType::kBF16, {c})};
  run(
      st, env, [&] { FERRY_CHECK_OK(env->be->rms_norm(a, env->stream)); }, 0,
      2.0 * t * c * 2 + t * 4);
}

void BM_SwiGlu(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t t = st.range(0), f = st.range(1);
  Dev g(t * f * 2, 18), u(t * f * 2, 19), y(t * f * 2, 20);
  const kernels::SwiGluArgs a{.out = y.view(DType::kBF16, {t, f}),
                              .gate = g.view(DType::kBF16, {t, f}),
                              .up = u.view(DType::kBF16, {t, f})};
  run(
      st, env, [&] { FERRY_CHECK_OK(env->be->swiglu(a, env->stream)); }, 0, 3.0 * t * f * 2);
}

void BM_Add(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t n = st.range(0);
  Dev a(n * 2, 21), b(n * 2, 22), y(n * 2, 23);
  const kernels::AddArgs args{.out = y.view(DType::kBF16, {n}),
                              .a = a.view(DType::kBF16, {n}),
                              .b = b.view(DType::kBF16, {n})};
  run(
      st, env, [&] { FERRY_CHECK_OK(env->be->add(args, env->stream)); }, 0, 3.0 * n * 2);
}

void BM_AdamW(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t n = st.range(0);
  Dev p(n * 4, 0), m(n * 4, 0), v(n * 4, 0), g(n * 4, 0), pb(n * 2, 0);
  cudaMemset(p.p, 0, n * 4);
  cudaMemset(m.p, 0, n * 4);
  cudaMemset(v.p, 0, n * 4);
  cudaMemset(g.p, 0, n * 4);
  cudaDeviceSynchronize();
  const kernels::AdamWArgs a{.param = p.view(DType::kF32, {n}),
                             .m = m.view(DType::kF32, {n}),
                             .v = v.view(DType::kF32, {n}),
                             .param_bf16 = pb.view(DType::kBF16, {n}),
                             .grad = g.view(DType::kF32, {n})};
  // reads p, m, v, g; writes p, m, v, p_bf16
  run(
      st, env, [&] { FERRY_CHECK_OK(env->be->adamw(a, env->stream)); }, 0,
      n * (4.0 * 4 + 3 * 4 + 2));
}

void BM_Copy(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t bytes = st.range(0);
  Dev a(bytes, 24), b(bytes, 25);
  run(
      st, env, [&] { cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, env->raw); }, 0,
      2.0 * bytes);
}

// Qwen2.5-3B (C 2048, F 11008, 16/2 heads) and 7B (C 3584, F 18944, 28/4 heads), 4096 tokens.
BENCHMARK(BM_Gemm)
    ->Args({4096, 2560, 2048})
    ->Args({4096, 2048, 2048})
    ->Args({4096, 22016, 2048})
    ->Args({4096, 2048, 11008})
    ->Args({4096, 4608, 3584})
    ->Args({4096, 3584, 3584})
    ->Args({4096, 37888, 3584})
    ->Args({4096, 3584, 18944})
    // As many timed launches as torch_baselines.py's GEMMs (Google Benchmark's default runs a
    // GEMM back to back for 0.5 s, torch's side 20 times): the GPU's clock under its power limit
    // depends on how long it has been busy.
    ->Iterations(kGemmReps)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttnFwdBwd)
    ->Args({1024, 8, 16, 2, 128, 0})
    ->Args({2048, 4, 16, 2, 128, 0})
    ->Args({4096, 2, 16, 2, 128, 0})
    ->Args({4096, 2, 28, 4, 128, 0})
    ->Args({2048, 4, 16, 2, 128, 1})
    ->Args({2048, 4, 16, 2, 128, 2})
    ->Args({1024, 8, 16, 2, 128, 3})
    ->Args({2048, 4, 16, 2, 128, 3})
    ->Args({4096, 2, 16, 2, 128, 3})
    ->Args({4096, 2, 28, 4, 128, 3})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
// 8192 tokens (e.g. 2 x 4096) and 32768 / 65536 (a training micro-batch of 8 x 4096 / 16 x 4096
// at the 7B / 3B width): the larger ones move ~0.5 GB per call, like the SwiGLU shapes below.
BENCHMARK(BM_RmsNorm)
    ->Args({8192, 2048})
    ->Args({8192, 3584})
    ->Args({32768, 3584})
    ->Args({65536, 2048})
    ->UseManualTime();
BENCHMARK(BM_SwiGlu)->Args({8192, 11008})->Args({8192, 18944})->UseManualTime();
BENCHMARK(BM_Add)->Args({8192 * 3584})->UseManualTime();
BENCHMARK(BM_AdamW)->Args({100000000})->UseManualTime();
// 1 GiB: the bandwidth ceiling. 32 / 56 MiB: copies moving as many bytes as rms_norm 8192x2048 /
// x3584 (read + write), where launch and tail are a comparable share of the time.
BENCHMARK(BM_Copy)->Args({1LL << 30})->Args({32LL << 20})->Args({56LL << 20})->UseManualTime();

}  // namespace

BENCHMARK_MAIN();
