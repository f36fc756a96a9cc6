// SPDX-License-Identifier: Apache-2.0
// RMSNorm forward and backward. Forward, rows of 64..512 16-byte vectors (C = 512..4096 bf16):
// one warp per row, each lane holding its 2-16 vectors in registers, so the row is read from
// memory once with many loads in flight; wider rows: one CTA per row (1-8 vectors per thread,
// a fixed-order block sum); narrow rows (per-head q/k norms): one warp per row, two passes over
// the row (the second hits L1). f32 math throughout. Backward:
// d_in one warp per row; d_weight by a second kernel in which each thread owns one column and a
// fixed slice of rows, reduced across slices in a fixed order, so d_weight is bitwise deterministic
// (no atomics). Tested in tests/gpu/kernels_dense_test.cpp.
#include <algorithm>

#include "kernels/cuda/common.cuh"

namespace ferry::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = 4;

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// 16-byte vectors of T (8 bf16 or 4 f32).
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
  T v[kN];
};

// kVec: rows are read and written as 16-byte vectors (c % Vec16<T>::kN == 0, 16-byte aligned).
template <typename T, bool kVec>
__global__ void rms_norm_kernel(T* __restrict__ out, float* __restrict__ rstd,
                                const T* __restrict__ in, const T* __restrict__ weight,
                                std::int64_t n, std::int64_t c, float eps) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= n) return;
  const T* x = in + row * c;
  T* y = out + row * c;
  float ss = 0.0f;
  if constexpr (kVec) {
    using V = Vec16<T>;
    const V* xv = reinterpret_cast<const V*>(x);
    const std::int64_t nv = c / V::kN;
    for (std::int64_t i = lane; i < nv; i += 32) {
      const V a = xv[i];
#pragma unroll
      for (int j = 0; j < V::kN; ++j) {
        const float f = to_f32(a.v[j]);
        ss = fmaf(f, f, ss);
      }
    }
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / static_cast<float>(c) + eps);
    if (rstd != nullptr && lane == 0) rstd[row] = r;
    const V* wv = reinterpret_cast<const V*>(weight);
    V* yv = reinterpret_cast<V*>(y);
    for (std::int64_t i = lane; i < nv; i += 32) {
      const V a = xv[i], w = wv[i];
      V o;
#pragma unroll
      for (int j = 0; j < V::kN; ++j) o.v[j] = from_f32<T>(to_f32(a.v[j]) * r * to_f32(w.v[j]));
      yv[i] = o;
    }
  } else {
    for (std::int64_t i = lane; i < c; i += 32) {
      const float v = to_f32(x[i]);
      ss = fmaf(v, v, ss);
    }
    ss = warp_sum(ss);
    const float r = rsqrtf(ss / static_cast<float>(c) + eps);
    if (rstd != nullptr && lane == 0) rstd[row] = r;
    for (std::int64_t i = lane; i < c; i += 32)
      y[i] = from_f32<T>(to_f32(x[i]) * r * to_f32(weight[i]));
  }
}

// The row-in-registers body shared by the two kernels below: `lane` of `lanes` threads holds
// vectors lane, lane + lanes, ... (up to kVpt) of the row; `reduce` sums across those threads.
template <typename T, int kVpt, typename Reduce>
__device__ __forceinline__ void rms_norm_row_in_registers(T* __restrict__ out, float* rstd,
                                                          const T* __restrict__ in,
                                                          const T* __restrict__ weight,
                                                          std::int64_t c, float eps, int lane,
                                                          int lanes, Reduce reduce) {
  using V = Vec16<T>;
  const std::int64_t nv = c / V::kN;
  const V* xv = reinterpret_cast<const V*>(in);
  V x[kVpt];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kVpt; ++j) {
    const std::int64_t i = lane + static_cast<std::int64_t>(j) * lanes;
    if (i < nv) {
      x[j] = xv[i];
#pragma unroll
      for (int e = 0; e < V::kN; ++e) {
        const float f = to_f32(x[j].v[e]);
        ss = fmaf(f, f, ss);
      }
    }
  }
  ss = reduce(ss);
  const float r = rsqrtf(ss / static_cast<float>(c) + eps);
  if (rstd != nullptr && lane == 0) *rstd = r;
  const V* wv = reinterpret_cast<const V*>(weight);
  V* yv = reinterpret_cast<V*>(out);
#pragma unroll
  for (int j = 0; j < kVpt; ++j) {
    const std::int64_t i = lane + static_cast<std::int64_t>(j) * lanes;
    if (i < nv) {
      const V w = wv[i];
      V o;
#pragma unroll
      for (int e = 0; e < V::kN; ++e) o.v[e] = from_f32<T>(to_f32(x[j].v[e]) * r * to_f32(w.v[e]));
      yv[i] = o;
    }
  }
}

// One warp per row (kRowsPerBlock rows per CTA).
template <typename T, int kVpt>
__global__ void rms_norm_warp_regs_kernel(T* __restrict__ out, float* __restrict__ rstd,
                                          const T* __restrict__ in, const T* __restrict__ weight,
                                          std::int64_t n, std::int64_t c, float eps) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= n) return;
  rms_norm_row_in_registers<T, kVpt>(out + row * c, rstd != nullptr ? rstd + row : nullptr,
                                     in + row * c, weight, c, eps, threadIdx.x & 31, 32,
                                     [](float v) { return warp_sum(v); });
}

// One CTA per row.
template <typename T, int kVpt>
__global__ void __launch_bounds__(1024)
    rms_norm_row_kernel(T* __restrict__ out, float* __restrict__ rstd, const T* __restrict__ in,
                        const T* __restrict__ weight, std::int64_t c, float eps) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  rms_norm_row_in_registers<T, kVpt>(out + row * c, rstd != nullptr ? rstd + row : nullptr,
                                     in + row * c, weight, c, eps, threadIdx.x, blockDim.x,
                                     [&](float v) { return block_sum(v, scratch); });
}

template <typename T>
__global__ void rms_norm_backward_dx_kernel(T* __restrict__ d_in, const T* __restrict__ d_out,
                                            const T* __restrict__ in, const T* __restrict__ weight,
                                            const float* __restrict__ rstd, std::int64_t n,
                                            std::int64_t c) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= n) return;
  const T* x = in + row * c;
  const T* dy = d_out + row * c;
  float dot = 0.0f;
  for (std::int64_t i = lane; i < c; i += 32)
    dot = fmaf(to_f32(dy[i]) * to_f32(weight[i]), to_f32(x[i]), dot);
  dot = warp_sum(dot);
  const float r = rstd[row];
  const float k = r * r * r * dot / static_cast<float>(c);
  T* dx = d_in + row * c;
  for (std::int64_t i = lane; i < c; i += 32)
    dx[i] = from_f32<T>(r * to_f32(dy[i]) * to_f32(weight[i]) - k * to_f32(x[i]));
}

// blockDim = (32 columns, 32 row slices). Row slice y sums rows y, y+32, ... in order; the 32
// slices are then added in order 0..31.
template <typename T>
__global__ void rms_norm_backward_dw_kernel(T* __restrict__ d_weight, const T* __restrict__ d_out,
                                            const T* __restrict__ in,
                                            const float* __restrict__ rstd, std::int64_t n,
                                            std::int64_t c) {
  __shared__ float part[32][33];
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < c) {
    for (std::int64_t row = threadIdx.y; row < n; row += 32)
      acc = fmaf(to_f32(d_out[row * c + col]) * to_f32(in[row * c + col]), rstd[row], acc);
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    float s = 0.0f;
    for (int y = 0; y < 32; ++y) s += part[y][threadIdx.x];
    d_weight[col] = from_f32<T>(to_f32(d_weight[col]) + s);
  }
}

}  // namespace

cudaError_t launch_rms_norm(Elt e, void* out, float* rstd, const void* in, const void* weight,
                            std::int64_t n, std::int64_t c, float eps, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = c % Vec16<T>::kN == 0 && aligned16(out) && aligned16(in) && aligned16(weight);
    const std::int64_t nv = c / Vec16<T>::kN;
    const unsigned warp_blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
    auto warp_regs = [&](auto kernel) {
      kernel<<<warp_blocks, 32 * kRowsPerBlock, 0, stream>>>(
          static_cast<T*>(out), rstd, static_cast<const T*>(in), static_cast<const T*>(weight), n,
          c, eps);
    };
    if (vec && nv >= 64 && nv <= 16 * 32) {
      if (nv <= 2 * 32) {
        warp_regs(rms_norm_warp_regs_kernel<T, 2>);
      } else if (nv <= 4 * 32) {
        warp_regs(rms_norm_warp_regs_kernel<T, 4>);
      } else if (nv <= 8 * 32) {
        warp_regs(rms_norm_warp_regs_kernel<T, 8>);
      } else {
        warp_regs(rms_norm_warp_regs_kernel<T, 16>);
      }
    } else if (vec && nv > 16 * 32 && nv <= 8 * 1024) {
      const int threads = static_cast<int>(std::min<std::int64_t>(1024, (nv + 31) / 32 * 32));
      const std::int64_t vpt = (nv + threads - 1) / threads;
      const unsigned rows = static_cast<unsigned>(n);
      auto go = [&](auto kernel) {
        kernel<<<rows, threads, 0, stream>>>(static_cast<T*>(out), rstd, static_cast<const T*>(in),
                                             static_cast<const T*>(weight), c, eps);
      };
      if (vpt == 1) {
        go(rms_norm_row_kernel<T, 1>);
      } else if (vpt == 2) {
        go(rms_norm_row_kernel<T, 2>);
      } else if (vpt <= 4) {
        go(rms_norm_row_kernel<T, 4>);
      } else {
        go(rms_norm_row_kernel<T, 8>);
      }
    } else if (vec) {
      rms_norm_kernel<T, true><<<blocks, 32 * kRowsPerBlock, 0, stream>>>(
          static_cast<T*>(out), rstd, static_cast<const T*>(in), static_cast<const T*>(weight), n,
          c, eps);
    } else {
      rms_norm_kernel<T, false><<<blocks, 32 * kRowsPerBlock, 0, stream>>>(
          static_cast<T*>(out), rstd, static_cast<const T*>(in), static_cast<const T*>(weight), n,
          c, eps);
    }
  });
}

cudaError_t launch_rms_norm_backward(Elt e, void* d_in, void* d_weight, const void* d_out,
                                     const void* in, const void* weight, const float* rstd,
                                     std::int64_t n, std::int64_t c, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    rms_norm_backward_dx_kernel<T><<<blocks, 32 * kRowsPerBlock, 0, stream>>>(
        static_cast<T*>(d_in), static_cast<const T*>(d_out), static_cast<const T*>(in),
        static_cast<const T*>(weight), rstd, n, c);
    if (d_weight != nullptr) {
      const unsigned col_blocks = static_cast<unsigned>((c + 31) / 32);
      rms_norm_backward_dw_kernel<T><<<col_blocks, dim3(32, 32), 0, stream>>>(
          static_cast<T*>(d_weight), static_cast<const T*>(d_out), static_cast<const T*>(in), rstd,
          n, c);
    }
  });
}

}  // namespace ferry::kernels::cuda
