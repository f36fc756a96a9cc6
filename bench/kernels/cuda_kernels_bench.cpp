// SPDX-License-Identifier: Apache-2.0
// Google Benchmark programs for the CUDA backend, timed with CUDA events (UseManualTime), L2
// flushed (256 MiB memset) before every repetition, rates computed from our own summed event time:
//   BM_Gemm/M/N/K           bf16 x bf16 -> bf16 (y = x W^T), TFLOP/s, Qwen2.5-3B/7B layer shapes,
//                           N(0, 1) operands like torch_baselines.py's torch.randn
//   BM_AttnFwdBwd/S/B/H/G/D/mode causal GQA forward + backward, packed varlen of B sequences of S
//                           (mode: 0 with the backward's workspace, 1 forward only, 2 no workspace,
//                           3 atomic dQ: FERRY_ATTN_BWD_DQ=atomic and its larger workspace)
//   BM_RmsNorm/T/C, BM_SwiGlu/T/F, BM_Add/N, BM_AdamW/N   GB/s of compulsory traffic
//   BM_Rope/T/H/G/D/dir/dt, BM_Embedding/T/V/C/dt, BM_EmbeddingBwd/T/V/C/dt, BM_AddRmsNorm/T/C
//                           the same (session 38; each row's traffic formula is above its bench)
//   BM_SmallMGemm/m/n/k/dt/loop, BM_SmallMQkv/m/dt/loop   the serve decode's small-m GEMMs
//                           (gemm_small_m.cu) with the one-step (loop 0) and pipelined (1) loops,
//                           GB/s of the weight, a and out (session 39; ferry only, no torch twin)
//   BM_Copy/bytes           cudaMemcpyAsync device->device: the bandwidth ceiling (GB/s, r+w)
// tools/bench/torch_baselines.py times PyTorch on the same shapes in the same device call, and
// tools/bench/compare.py turns both JSON files into ratios (scripts/gpu_check.sh runs all three).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
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
#include "kernels/cuda/decode_fusion.h"
#include "kernels/cuda/launchers.h"

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

// Session 38's memory-bound rows (RoPE, embedding forward / backward, the fused residual norm):
// a fixed kMemReps timed launches each (Google Benchmark's default, 0.5 s of event time, is 10-30 k
// launches of these 20-100 us kernels, ~2 s of wall time a row, and scripts/gpu_check.sh gives the
// whole binary 150 s), and BM_Copy rows of the same bytes with the same count (registered below).
constexpr int kMemReps = 500;
constexpr std::int64_t kSeqLen = 4096;  // the 8192-token rows are 2 sequences of 4096 (positions)
constexpr double kRopeTheta = 1e6;      // Qwen2.5's rope_theta

// dt argument of those rows: 0 bf16, 1 f32 (ModelCompute runs rope and the embedding on f32).
DType dt_of(std::int64_t code) { return code == 0 ? DType::kBF16 : DType::kF32; }

// Host values over the first bytes of a Dev, landed before the first launch reads them (see Dev).
template <typename T>
void upload(const Dev& d, const std::vector<T>& h) {
  FERRY_CHECK(h.size() * sizeof(T) <= d.bytes, "bench: {} values into {} bytes", h.size(), d.bytes);
  cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();
}

// Token ids, the same as torch_baselines.py's token_ids(): a multiplicative hash of the index
// modulo V, i.e. spread uniformly over the table (at T 8192, V 151936 all 8192 are distinct; real
// text repeats tokens, which the traffic formulas below count through U).
std::vector<std::int32_t> token_ids(std::int64_t t, std::int64_t v) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(t));
  for (std::int64_t i = 0; i < t; ++i) {
    const std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u;
    ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(x % static_cast<std::uint32_t>(v));
  }
  return ids;
}

// U: how many distinct rows the ids touch.
std::int64_t distinct_ids(std::vector<std::int32_t> ids) {
  std::sort(ids.begin(), ids.end());
  return std::unique(ids.begin(), ids.end()) - ids.begin();
}

// RoPE over one layer's q [T, H, D] and k [T, G, D]: two in-place launches, as ModelCompute runs
// them; positions tok % 4096, Qwen2.5's inv_freq (theta 1e6, R = D). dir 0 forward, 1 backward
// (RopeArgs::backward: the same kernel, angle negated). Every rope-scaling variant that
// config_rope.cpp reads (linear, dynamic, yarn, llama3) changes only the host-computed inv_freq
// and attention_scaling, not the kernel, so none has a row of its own. Compulsory traffic (s =
// bytes per element): read + write q and k, read positions and inv_freq:
//   2 * T * (H + G) * D * s + 4 * T + 4 * D / 2
void BM_Rope(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t t = st.range(0), h = st.range(1), g = st.range(2), d = st.range(3);
  const bool backward = st.range(4) == 1;
  const DType dt = dt_of(st.range(5));
  const auto s = static_cast<std::int64_t>(dtype_size(dt));
  Dev q(t * h * d * s, 30), k(t * g * d * s, 31), pos(t * 4, 0), freq(d / 2 * 4, 0);
  std::vector<std::int32_t> h_pos(static_cast<std::size_t>(t));
  for (std::int64_t i = 0; i < t; ++i)
    h_pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i % kSeqLen);
  std::vector<float> h_freq(static_cast<std::size_t>(d / 2));
  for (std::int64_t i = 0; i < d / 2; ++i) {
    h_freq[static_cast<std::size_t>(i)] =
        static_cast<float>(1.0 / std::pow(kRopeTheta, 2.0 * static_cast<double>(i) / d));
  }
  upload(pos, h_pos);
  upload(freq, h_freq);
  const kernels::RopeArgs qa{.x = q.view(dt, {t, h, d}),
                             .positions = pos.view(DType::kI32, {t}),
                             .inv_freq = freq.view(DType::kF32, {d / 2}),
                             .backward = backward};
  kernels::RopeArgs ka = qa;
  ka.x = k.view(dt, {t, g, d});
  run(
      st, env,
      [&] {
        FERRY_CHECK_OK(env->be->rope(qa, env->stream));
        FERRY_CHECK_OK(env->be->rope(ka, env->stream));
      },
      0, 2.0 * t * (h + g) * d * s + 4.0 * t + 4.0 * (d / 2));
}

// Embedding lookup out [T, C] = table [V, C] rows at token_ids(T, V), table and out dt.
// Compulsory traffic: read the ids, read each distinct row once (U of them; a repeated id's row
// may come from L2), write out:
//   4 * T + U * C * s + T * C * s
void BM_Embedding(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t t = st.range(0), v = st.range(1), c = st.range(2);
  const DType dt = dt_of(st.range(3));
  const auto s = static_cast<std::int64_t>(dtype_size(dt));
  Dev table(v * c * s, 32), out(t * c * s, 33), ids(t * 4, 0);
  const std::vector<std::int32_t> h_ids = token_ids(t, v);
  upload(ids, h_ids);
  const auto u = static_cast<double>(distinct_ids(h_ids));
  const kernels::EmbeddingArgs a{.out = out.view(dt, {t, c}),
                                 .table = table.view(dt, {v, c}),
                                 .ids = ids.view(DType::kI32, {t})};
  run(
      st, env, [&] { FERRY_CHECK_OK(env->be->embedding(a, env->stream)); }, 0,
      4.0 * t + u * c * s + 1.0 * t * c * s);
}

// Embedding backward: d_table [V, C] += d_out [T, C] scattered to the rows token_ids(T, V) (the
// deterministic sliced kernel, embedding.cu), d_table and d_out dt. Compulsory traffic: read the
// ids and d_out, read-modify-write the U distinct rows touched (the V - U others are not read):
//   4 * T + T * C * s + 2 * U * C * s
// (torch's autograd builds a dense zeroed [V, C] gradient first; that memset is not counted.)
void BM_EmbeddingBwd(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t t = st.range(0), v = st.range(1), c = st.range(2);
  const DType dt = dt_of(st.range(3));
  const auto s = static_cast<std::int64_t>(dtype_size(dt));
  Dev d_table(v * c * s, 34), d_out(t * c * s, 35), ids(t * 4, 0);
  const std::vector<std::int32_t> h_ids = token_ids(t, v);
  upload(ids, h_ids);
  const auto u = static_cast<double>(distinct_ids(h_ids));
  const kernels::EmbeddingBackwardArgs a{.d_table = d_table.view(dt, {v, c}),
                                         .d_out = d_out.view(dt, {t, c}),
                                         .ids = ids.view(DType::kI32, {t})};
  run(
      st, env, [&] { FERRY_CHECK_OK(env->be->embedding_backward(a, env->stream)); }, 0,
      4.0 * t + 1.0 * t * c * s + 2.0 * u * c * s);
}

// The fused residual add + rms_norm (kernels::cuda::add_rms_norm, f32 only: the serve decode
// fusion kAddNorm; training runs add and rms_norm as two launches): x_out = x + y, out =
// rms_norm(x_out) * weight, rstd saved. Compulsory traffic: read x and y, write x_out and out,
// read weight, write rstd:
//   4 * T * C * 4 + 4 * C + 4 * T
void BM_AddRmsNorm(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t t = st.range(0), c = st.range(1);
  Dev x(t * c * 4, 36), y(t * c * 4, 37), x_out(t * c * 4, 38), out(t * c * 4, 39), w(c * 4, 40),
      r(t * 4, 41);
  const kernels::cuda::AddRmsNormArgs a{.x_out = static_cast<float*>(x_out.p),
                                        .out = static_cast<float*>(out.p),
                                        .rstd = static_cast<float*>(r.p),
                                        .x = static_cast<const float*>(x.p),
                                        .y = static_cast<const float*>(y.p),
                                        .weight = static_cast<const float*>(w.p),
                                        .n = t,
                                        .c = c,
                                        .eps = 1e-6f};
  run(
      st, env, [&] { FERRY_CHECK_OK(kernels::cuda::add_rms_norm(a, env->stream)); }, 0,
      4.0 * t * c * 4 + 4.0 * c + 4.0 * t);
}

// The serve decode's small-m GEMMs (gemm_small_m.cu): out [m, n] f32 = a [m, k] f32 @ b [n, k]^T,
// b bf16 (dt 0, --dense-dtype bf16) or f32 (dt 1), loop 0 the one-step loop, 1 the pipelined one
// (the same bits; tests/gpu/kernels_small_m_loop_test.cpp). Qwen3-30B-A3B shapes: q 4096 x 2048,
// k/v 512 x 2048, o 2048 x 4096, lm_head 151936 x 2048; m 1 (one stream) and 4. The L2 flush
// before each timed launch leaves the weight in HBM, as in a 48-layer decode step. Compulsory
// traffic: read the weight once, read a, write out:
//   n * k * s + 4 * m * k + 4 * m * n
kernels::cuda::SmallMLoop loop_of(std::int64_t code) {
  return code == 0 ? kernels::cuda::SmallMLoop::kOneStep : kernels::cuda::SmallMLoop::kPipelined;
}

void BM_SmallMGemm(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t m = st.range(0), n = st.range(1), k = st.range(2);
  const bool bf16 = st.range(3) == 0;
  const auto loop = loop_of(st.range(4));
  const std::int64_t s = bf16 ? 2 : 4;
  Dev a(m * k * 4, 42), w(n * k * s, 43), out(m * n * 4, 44);
  run(
      st, env,
      [&] {
        const cudaError_t e = bf16 ? kernels::cuda::launch_small_m_gemm_bf16w(
                                         static_cast<float*>(out.p), static_cast<const float*>(a.p),
                                         static_cast<const std::uint16_t*>(w.p), nullptr, m, n, k,
                                         k, k, n, 1.0f, 0.0f, env->raw, loop)
                                   : kernels::cuda::launch_small_m_gemm_f32(
                                         static_cast<float*>(out.p), static_cast<const float*>(a.p),
                                         static_cast<const float*>(w.p), nullptr, m, n, k, k, k, n,
                                         1.0f, 0.0f, env->raw, loop);
        FERRY_CHECK(e == cudaSuccess, "bench: small-m GEMM launch: {}", cudaGetErrorString(e));
      },
      0, 1.0 * n * k * s + 4.0 * m * k + 4.0 * m * n);
}

// A decode step's q/k/v in one launch (decode fusion kQkv): q 4096, k 512, v 512 columns on the
// same a [m, 2048]; traffic as above over the three weights.
void BM_SmallMQkv(benchmark::State& st) {
  Env* env = Env::get(st);
  if (!env) return;
  const std::int64_t m = st.range(0), k = 2048;
  const std::int64_t ns[3] = {4096, 512, 512};
  const bool bf16 = st.range(1) == 0;
  const auto loop = loop_of(st.range(2));
  const std::int64_t s = bf16 ? 2 : 4;
  Dev a(m * k * 4, 45), wq(ns[0] * k * s, 46), wk(ns[1] * k * s, 47), wv(ns[2] * k * s, 48);
  Dev oq(m * ns[0] * 4, 49), ok(m * ns[1] * 4, 50), ov(m * ns[2] * 4, 51);
  const Dev* ws[3] = {&wq, &wk, &wv};
  const Dev* os[3] = {&oq, &ok, &ov};
  kernels::cuda::SmallMGemmOutput outs[3];
  double bytes = 4.0 * m * k;
  for (int o = 0; o < 3; ++o) {
    outs[o] = {.out = static_cast<float*>(os[o]->p),
               .b = ws[o]->p,
               .bias = nullptr,
               .n = ns[o],
               .ldb = k,
               .ldo = ns[o]};
    bytes += 1.0 * ns[o] * k * s + 4.0 * m * ns[o];
  }
  run(
      st, env,
      [&] {
        const cudaError_t e =
            bf16
                ? kernels::cuda::launch_small_m_gemm_multi_bf16w(
                      outs, 3, static_cast<const float*>(a.p), m, k, k, 1.0f, 0.0f, env->raw, loop)
                : kernels::cuda::launch_small_m_gemm_multi_f32(
                      outs, 3, static_cast<const float*>(a.p), m, k, k, 1.0f, 0.0f, env->raw, loop);
        FERRY_CHECK(e == cudaSuccess, "bench: small-m q/k/v launch: {}", cudaGetErrorString(e));
      },
      0, bytes);
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
// Session 38 (not yet run on a GPU): Qwen2.5-3B (C 2048, 16/2 heads) and 7B (C 3584, 28/4 heads),
// 8192 tokens, head dim 128, vocabulary 151936; dt 0 bf16, 1 f32. torch_baselines.py times the
// same rows (HF's apply_rotary_pos_emb and its autograd backward, F.embedding, index_add_, add +
// F.rms_norm).
BENCHMARK(BM_Rope)
    ->ArgsProduct({{8192}, {16}, {2}, {128}, {0, 1}, {0, 1}})
    ->ArgsProduct({{8192}, {28}, {4}, {128}, {0, 1}, {0, 1}})
    ->Iterations(kMemReps)
    ->UseManualTime();
BENCHMARK(BM_Embedding)
    ->ArgsProduct({{8192}, {151936}, {2048, 3584}, {0, 1}})
    ->Iterations(kMemReps)
    ->UseManualTime();
BENCHMARK(BM_EmbeddingBwd)
    ->ArgsProduct({{8192}, {151936}, {2048, 3584}, {0, 1}})
    ->Iterations(kMemReps)
    ->UseManualTime();
BENCHMARK(BM_AddRmsNorm)
    ->Args({8192, 2048})
    ->Args({8192, 3584})
    ->Iterations(kMemReps)
    ->UseManualTime();
// Copies moving the bytes of those rows (read + write = the row's traffic / 2, MiB): rope 36 / 72
// (3B bf16 / f32), 64 / 128 (7B); embedding 32 / 64 and 56 / 112 (forward: the 32 / 56 above),
// 48 / 96 and 84 / 168 (backward); add_rms_norm 128 / 224. compare.py pairs each row with the copy
// whose traffic is nearest to its own.
BENCHMARK(BM_Copy)
    ->ArgsProduct({{36LL << 20, 48LL << 20, 64LL << 20, 72LL << 20, 84LL << 20, 96LL << 20,
                    112LL << 20, 128LL << 20, 168LL << 20, 224LL << 20}})
    ->Iterations(kMemReps)
    ->UseManualTime();
// Session 39: the small-m GEMMs, one-step (0) then pipelined (1) loop, bf16 (0) and f32 (1)
// weights; copies of 8 / 10 / 296 MiB move about the bytes of q and o (16.8 MB), q/k/v (21 MB) and
// the bf16 lm_head (622 MB).
BENCHMARK(BM_SmallMGemm)
    ->ArgsProduct({{1}, {4096, 512}, {2048}, {0, 1}, {0, 1}})
    ->ArgsProduct({{1, 4}, {2048}, {4096}, {0, 1}, {0, 1}})
    ->ArgsProduct({{1}, {151936}, {2048}, {0}, {0, 1}})
    ->Iterations(kMemReps)
    ->UseManualTime();
BENCHMARK(BM_SmallMQkv)
    ->ArgsProduct({{1, 4}, {0, 1}, {0, 1}})
    ->Iterations(kMemReps)
    ->UseManualTime();
BENCHMARK(BM_Copy)
    ->ArgsProduct({{8LL << 20, 10LL << 20, 296LL << 20}})
    ->Iterations(kMemReps)
    ->UseManualTime();

}  // namespace

BENCHMARK_MAIN();
