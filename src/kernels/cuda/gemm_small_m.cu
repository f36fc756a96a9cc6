// SPDX-License-Identifier: Apache-2.0
// f32 GEMM for a handful of rows against a row-major weight (a linear layer in a decode step):
//   out[r, j] = alpha * sum_q a[r, q] * b[j, q] (+ bias[j]) + beta * out[r, j],   r < m <= 4.
// One warp per output column j reads b's row j once for all m rows (float4 loads when k, the
// row strides and the pointers allow), each lane summing a fixed k-stride, then the fixed xor
// tree of warp_sum: a row's result depends only on that row and b, never on how many rows share
// the launch (a decode step of 1 or 3 sequences gives each sequence the same bits).
// Why: cuBLASLt's choices for m = 1 on the serve decode shapes ran at 0.45-2.3 TB/s (ncu on the
// H200, session 10: 9 us for a 2048 x 512 f32 weight, 14 us for 2048 x 4096), where reading the
// weight once at HBM speed takes 1-11 us. Tested in tests/gpu/kernels_dense_test.cpp against
// the f64 reference with style.md's rule, and for row independence.
// bf16 weights (launch_small_m_gemm_bf16w; the serving engine's --dense-dtype bf16): the same
// kernel template with b in bf16 bits, each weight widened exactly to f32 where the f32 kernel
// reads it, then the same products, the same per-lane order (4 weights per vector step when the
// f32 kernel would take float4 steps: k, lda, ldb multiples of 4, a 16-byte aligned, b 8-byte
// aligned — the bf16 image of a 16-byte aligned f32 row), the same warp tree and epilogue. So it
// gives the f32 kernel's bits on the widened weight (an f32 copy with the same ldb, 16-byte
// aligned), at half the bytes read. Tested bit for bit on swept shapes in
// tests/gpu/serve_dense_bf16_gpu_test.cpp.
// Several outputs on one input (small_m_gemm_multi_kernel, a decode step's q/k/v in one launch;
// docs/cuda.md "Decode fusions"): each column is the same column code, so each output gets its
// own launch's bits. Tested bit for bit in tests/gpu/serve_decode_fusion_gpu_test.cpp.
// The pipelined loop (SmallMLoop::kPipelined; the default since session 40, off with
// FERRY_SMALL_M_PIPELINE=0, docs/cuda.md "Small-m GEMM: loads in flight"; kOneStep is the loop
// before it): each lane issues the loads of kUnroll consecutive steps of its own stride before it
// adds any of them, then adds them in the same order as the one-step loop, so the bits are the
// one-step loop's (tested bit for bit in tests/gpu/kernels_small_m_loop_test.cpp). Why: one
// 8-byte bf16 load in flight per lane left a decode step's q/k/v and o projections latency-bound
// (ncu on the H200, session 12: 8.7 us for a 2048 x 4096 bf16 weight, ~1.9 TB/s).
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/pdl.cuh"

namespace ferry::kernels::cuda {
namespace {

constexpr int kWarps = 8;
// Vector steps (4 weights each) whose loads one lane has in flight in the pipelined loop.
constexpr int kUnroll = 8;

// The weight's element as f32: itself, or a bf16 (raw bits) widened exactly.
__device__ __forceinline__ float widen(float w) { return w; }
__device__ __forceinline__ float widen(std::uint16_t w) {
  return __uint_as_float(static_cast<unsigned>(w) << 16);
}
// Four consecutive weights (one vector step), 16-byte (f32) or 8-byte (bf16) aligned.
struct W4 {
  float x, y, z, w;
};
__device__ __forceinline__ W4 load4(const float* w, std::int64_t q) {
  const float4 v = reinterpret_cast<const float4*>(w)[q];
  return {v.x, v.y, v.z, v.w};
}
__device__ __forceinline__ W4 load4(const std::uint16_t* w, std::int64_t q) {
  const uint2 v = reinterpret_cast<const uint2*>(w)[q];
  return {__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
          __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u)};
}

// One vector step q of a lane (4 weights, already loaded) added to the M rows' sums.
template <int M>
__device__ __forceinline__ void add_step4(float (&acc)[M], const W4& wv,
                                          const float* __restrict__ a, std::int64_t lda,
                                          std::int64_t q) {
#pragma unroll
  for (int r = 0; r < M; ++r) {
    const float4 xv = reinterpret_cast<const float4*>(a + r * lda)[q];
    acc[r] += wv.x * xv.x;
    acc[r] += wv.y * xv.y;
    acc[r] += wv.z * xv.z;
    acc[r] += wv.w * xv.w;
  }
}

// One output column j of out = alpha * a @ b^T (+ bias) + beta * out for M rows, computed by the
// calling warp (`lane` 0..31): the body of small_m_gemm_kernel, shared with the multi-output
// kernel below so both compile the same per-element arithmetic (the same bits).
// Wt: float, or std::uint16_t (bf16 bits). Every f32 operation is the same for both.
// kPipe: load kUnroll steps, then add them in order (the one-step loop's order and bits); the
// steps left over (fewer than kUnroll for this lane) run one at a time as in the one-step loop.
template <int M, bool kVec, bool kPipe, typename Wt>
__device__ __forceinline__ void small_m_gemm_column(
    float* __restrict__ out, const float* __restrict__ a, const Wt* __restrict__ b,
    const float* __restrict__ bias, std::int64_t j, int lane, std::int64_t k, std::int64_t lda,
    std::int64_t ldb, std::int64_t ldo, float alpha, float beta) {
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;
  const Wt* w = b + j * ldb;
  if constexpr (kVec) {
    const std::int64_t k4 = k / 4;
    std::int64_t q = lane;
    if constexpr (kPipe) {
      for (; q + 32 * (kUnroll - 1) < k4; q += 32 * kUnroll) {
        W4 wv[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wv[u] = load4(w, q + 32 * u);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) add_step4<M>(acc, wv[u], a, lda, q + 32 * u);
      }
    }
    for (; q < k4; q += 32) add_step4<M>(acc, load4(w, q), a, lda, q);
  } else {
    std::int64_t q = lane;
    if constexpr (kPipe) {
      for (; q + 32 * (kUnroll - 1) < k; q += 32 * kUnroll) {
        float wq[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wq[u] = widen(w[q + 32 * u]);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
          for (int r = 0; r < M; ++r) acc[r] += wq[u] * a[r * lda + q + 32 * u];
        }
      }
    }
    for (; q < k; q += 32) {
      const float wq = widen(w[q]);
#pragma unroll
      for (int r = 0; r < M; ++r) acc[r] += wq * a[r * lda + q];
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = warp_sum(acc[r]);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      float v = alpha * acc[r];
      if (bias != nullptr) v += bias[j];
      if (beta != 0.0f) v += beta * out[r * ldo + j];
      out[r * ldo + j] = v;
    }
  }
}

template <int M, bool kVec, bool kPipe, typename Wt>
__global__ void __launch_bounds__(kWarps * 32)
    small_m_gemm_kernel(float* __restrict__ out, const float* __restrict__ a,
                        const Wt* __restrict__ b, const float* __restrict__ bias, std::int64_t n,
                        std::int64_t k, std::int64_t lda, std::int64_t ldb, std::int64_t ldo,
                        float alpha, float beta) {
  pdl_wait();
  pdl_trigger();
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (j >= n) return;
  small_m_gemm_column<M, kVec, kPipe, Wt>(out, a, b, bias, j, lane, k, lda, ldb, ldo, alpha, beta);
}

// Up to kSmallGemmMaxOutputs linear layers on the same input rows in one launch (a decode step's
// q/k/v, or gate/up): output o owns blocks [first[o], first[o + 1]), kWarps columns each, and
// every column is small_m_gemm_column on that output's weight, bias and leading dimensions — the
// single-output kernel's bits for each output element.
template <typename Wt>
struct MultiOutputs {
  float* out[kSmallGemmMaxOutputs];
  const Wt* b[kSmallGemmMaxOutputs];
  const float* bias[kSmallGemmMaxOutputs];
  std::int64_t n[kSmallGemmMaxOutputs], ldb[kSmallGemmMaxOutputs], ldo[kSmallGemmMaxOutputs];
  unsigned first[kSmallGemmMaxOutputs + 1];  // first block of each output, then the grid size
};

template <int M, bool kVec, bool kPipe, typename Wt>
__global__ void __launch_bounds__(kWarps * 32)
    small_m_gemm_multi_kernel(const MultiOutputs<Wt> o, const float* __restrict__ a, std::int64_t k,
                              std::int64_t lda, float alpha, float beta) {
  pdl_wait();
  pdl_trigger();
  int s = 0;
#pragma unroll
  for (int i = 1; i < kSmallGemmMaxOutputs; ++i) s += blockIdx.x >= o.first[i] ? 1 : 0;
  const std::int64_t j =
      static_cast<std::int64_t>(blockIdx.x - o.first[s]) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (j >= o.n[s]) return;
  small_m_gemm_column<M, kVec, kPipe, Wt>(o.out[s], a, o.b[s], o.bias[s], j, lane, k, lda, o.ldb[s],
                                          o.ldo[s], alpha, beta);
}

bool aligned(const void* p, std::uintptr_t bytes) {
  return (reinterpret_cast<std::uintptr_t>(p) & (bytes - 1)) == 0;
}

// Whether a launch on weight b takes the vector loop: b's alignment for one vector step of 4
// weights is 16 bytes of f32, 8 of bf16.
template <typename Wt>
bool vec_ok(const float* a, const Wt* b, std::int64_t k, std::int64_t lda, std::int64_t ldb) {
  return k % 4 == 0 && lda % 4 == 0 && ldb % 4 == 0 && aligned(a, 16) && aligned(b, 4 * sizeof(Wt));
}

// Whether SmallMLoop::kDefault takes the pipelined loop: yes unless FERRY_SMALL_M_PIPELINE=0 (the
// one-step loop, for A/B runs; docs/cuda.md "Small-m GEMM: loads in flight"); read once per
// process.
bool pipeline_default() {
  static const bool on = [] {
    const char* v = std::getenv("FERRY_SMALL_M_PIPELINE");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

bool pipelined(SmallMLoop loop) {
  return loop == SmallMLoop::kDefault ? pipeline_default() : loop == SmallMLoop::kPipelined;
}

template <int M, bool kPipe, typename Wt>
void launch_m_loop(float* out, const float* a, const Wt* b, const float* bias, std::int64_t n,
                   std::int64_t k, std::int64_t lda, std::int64_t ldb, std::int64_t ldo,
                   float alpha, float beta, cudaStream_t stream) {
  const auto grid = static_cast<unsigned>((n + kWarps - 1) / kWarps);
  if (vec_ok(a, b, k, lda, ldb)) {
    launch_pdl(small_m_gemm_kernel<M, true, kPipe, Wt>, grid, kWarps * 32, 0, stream, out, a, b,
               bias, n, k, lda, ldb, ldo, alpha, beta);
  } else {
    launch_pdl(small_m_gemm_kernel<M, false, kPipe, Wt>, grid, kWarps * 32, 0, stream, out, a, b,
               bias, n, k, lda, ldb, ldo, alpha, beta);
  }
}

template <int M, typename Wt>
void launch_m(float* out, const float* a, const Wt* b, const float* bias, std::int64_t n,
              std::int64_t k, std::int64_t lda, std::int64_t ldb, std::int64_t ldo, float alpha,
              float beta, bool pipe, cudaStream_t stream) {
  if (pipe) {
    launch_m_loop<M, true, Wt>(out, a, b, bias, n, k, lda, ldb, ldo, alpha, beta, stream);
  } else {
    launch_m_loop<M, false, Wt>(out, a, b, bias, n, k, lda, ldb, ldo, alpha, beta, stream);
  }
}

template <typename Wt>
cudaError_t launch_typed(float* out, const float* a, const Wt* b, const float* bias, std::int64_t m,
                         std::int64_t n, std::int64_t k, std::int64_t lda, std::int64_t ldb,
                         std::int64_t ldo, float alpha, float beta, bool pipe,
                         cudaStream_t stream) {
  if (m < 1 || m > kSmallGemmMaxRows || n < 0 || k < 1) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  switch (m) {
    case 1:
      launch_m<1>(out, a, b, bias, n, k, lda, ldb, ldo, alpha, beta, pipe, stream);
      break;
    case 2:
      launch_m<2>(out, a, b, bias, n, k, lda, ldb, ldo, alpha, beta, pipe, stream);
      break;
    case 3:
      launch_m<3>(out, a, b, bias, n, k, lda, ldb, ldo, alpha, beta, pipe, stream);
      break;
    default:
      launch_m<4>(out, a, b, bias, n, k, lda, ldb, ldo, alpha, beta, pipe, stream);
      break;
  }
  return cudaGetLastError();
}

template <int M, bool kVec, typename Wt>
void launch_multi_m(const MultiOutputs<Wt>& o, int count, const float* a, std::int64_t k,
                    std::int64_t lda, float alpha, float beta, bool pipe, cudaStream_t stream) {
  if (pipe) {
    launch_pdl(small_m_gemm_multi_kernel<M, kVec, true, Wt>, o.first[count], kWarps * 32, 0, stream,
               o, a, k, lda, alpha, beta);
  } else {
    launch_pdl(small_m_gemm_multi_kernel<M, kVec, false, Wt>, o.first[count], kWarps * 32, 0,
               stream, o, a, k, lda, alpha, beta);
  }
}

template <typename Wt>
cudaError_t launch_multi_typed(const SmallMGemmOutput* outs, int count, const float* a,
                               std::int64_t m, std::int64_t k, std::int64_t lda, float alpha,
                               float beta, bool pipe, cudaStream_t stream) {
  if (count < 1 || count > kSmallGemmMaxOutputs || m < 1 || m > kSmallGemmMaxRows || k < 1) {
    return cudaErrorInvalidValue;
  }
  MultiOutputs<Wt> o{};
  bool vec = true, scalar = true;
  std::int64_t blocks = 0;
  for (int i = 0; i < count; ++i) {
    if (outs[i].n < 0) return cudaErrorInvalidValue;
    o.out[i] = outs[i].out;
    o.b[i] = static_cast<const Wt*>(outs[i].b);
    o.bias[i] = outs[i].bias;
    o.n[i] = outs[i].n;
    o.ldb[i] = outs[i].ldb;
    o.ldo[i] = outs[i].ldo;
    o.first[i] = static_cast<unsigned>(blocks);
    blocks += (outs[i].n + kWarps - 1) / kWarps;
    const bool v = vec_ok(a, o.b[i], k, lda, outs[i].ldb);
    vec = vec && v;
    scalar = scalar && !v;
  }
  for (int i = count; i <= kSmallGemmMaxOutputs; ++i) o.first[i] = static_cast<unsigned>(blocks);
  if (blocks == 0) return cudaSuccess;
  if (!vec && !scalar) {
    // The outputs would take different loops (launch_m's choice per weight): one launch each, so
    // each keeps the single-output kernel's bits.
    for (int i = 0; i < count; ++i) {
      if (outs[i].n == 0) continue;
      const cudaError_t e = launch_typed(outs[i].out, a, o.b[i], outs[i].bias, m, outs[i].n, k, lda,
                                         outs[i].ldb, outs[i].ldo, alpha, beta, pipe, stream);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  auto go = [&](auto mc) {
    constexpr int M = decltype(mc)::value;
    if (vec) {
      launch_multi_m<M, true, Wt>(o, count, a, k, lda, alpha, beta, pipe, stream);
    } else {
      launch_multi_m<M, false, Wt>(o, count, a, k, lda, alpha, beta, pipe, stream);
    }
  };
  switch (m) {
    case 1:
      go(std::integral_constant<int, 1>{});
      break;
    case 2:
      go(std::integral_constant<int, 2>{});
      break;
    case 3:
      go(std::integral_constant<int, 3>{});
      break;
    default:
      go(std::integral_constant<int, 4>{});
      break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_small_m_gemm_multi_f32(const SmallMGemmOutput* outs, int count, const float* a,
                                          std::int64_t m, std::int64_t k, std::int64_t lda,
                                          float alpha, float beta, cudaStream_t stream,
                                          SmallMLoop loop) {
  return launch_multi_typed<float>(outs, count, a, m, k, lda, alpha, beta, pipelined(loop), stream);
}

cudaError_t launch_small_m_gemm_multi_bf16w(const SmallMGemmOutput* outs, int count, const float* a,
                                            std::int64_t m, std::int64_t k, std::int64_t lda,
                                            float alpha, float beta, cudaStream_t stream,
                                            SmallMLoop loop) {
  return launch_multi_typed<std::uint16_t>(outs, count, a, m, k, lda, alpha, beta, pipelined(loop),
                                           stream);
}

cudaError_t launch_small_m_gemm_f32(float* out, const float* a, const float* b, const float* bias,
                                    std::int64_t m, std::int64_t n, std::int64_t k,
                                    std::int64_t lda, std::int64_t ldb, std::int64_t ldo,
                                    float alpha, float beta, cudaStream_t stream, SmallMLoop loop) {
  return launch_typed(out, a, b, bias, m, n, k, lda, ldb, ldo, alpha, beta, pipelined(loop),
                      stream);
}

cudaError_t launch_small_m_gemm_bf16w(float* out, const float* a, const std::uint16_t* b,
                                      const float* bias, std::int64_t m, std::int64_t n,
                                      std::int64_t k, std::int64_t lda, std::int64_t ldb,
                                      std::int64_t ldo, float alpha, float beta,
                                      cudaStream_t stream, SmallMLoop loop) {
  return launch_typed(out, a, b, bias, m, n, k, lda, ldb, ldo, alpha, beta, pipelined(loop),
                      stream);
}

}  // namespace ferry::kernels::cuda
