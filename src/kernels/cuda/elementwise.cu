// SPDX-License-Identifier: Apache-2.0
// Memory-bound elementwise ops: add, swiglu (+backward), adamw, sum_squares, convert (f32 <->
// bf16). Grid-stride loops; add and swiglu use 16-byte vector accesses when every pointer is
// 16-byte aligned, with a scalar tail. f32 math, bf16 or f32 storage. Tested in
// tests/gpu/kernels_dense_test.cpp against the CPU/reference backends.
#include "kernels/cuda/common.cuh"

namespace ferry::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Vector width in elements for 16-byte accesses.
template <typename T>
constexpr int vec_n() {
  return 16 / static_cast<int>(sizeof(T));
}

template <typename T>
struct alignas(16) Vec {
  T v[vec_n<T>()];
};

template <typename T>
__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

template <typename T, typename Op>
__global__ void binary_kernel(T* out, const T* a, const T* b, std::int64_t n, Op op) {
  constexpr int kV = vec_n<T>();
  const std::int64_t nvec = n / kV;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t start = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool vec_ok = aligned16<T>(out) && aligned16<T>(a) && aligned16<T>(b);
  std::int64_t tail_begin = 0;
  if (vec_ok) {
    for (std::int64_t i = start; i < nvec; i += stride) {
      Vec<T> va = reinterpret_cast<const Vec<T>*>(a)[i];
      Vec<T> vb = reinterpret_cast<const Vec<T>*>(b)[i];
      Vec<T> vo;
#pragma unroll
      for (int j = 0; j < kV; ++j) vo.v[j] = from_f32<T>(op(to_f32(va.v[j]), to_f32(vb.v[j])));
      reinterpret_cast<Vec<T>*>(out)[i] = vo;
    }
    tail_begin = nvec * kV;
  }
  for (std::int64_t i = tail_begin + start; i < n; i += stride)
    out[i] = from_f32<T>(op(to_f32(a[i]), to_f32(b[i])));
}

struct AddOp {
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct SwiGluOp {
  __device__ float operator()(float g, float u) const { return g / (1.0f + __expf(-g)) * u; }
};

struct alignas(8) Bf16x4 {
  bf16 v[4];
};

// SwiGLU over f32 that also writes the bf16 rounding of each output (convert_kernel's rounding,
// so out16 equals convert(out) bit for bit; out itself is the same expression as SwiGluOp in
// binary_kernel<float>). 16-byte accesses for gate/up/out and 8-byte for out16 when aligned.
__global__ void swiglu_f32_bf16_kernel(float* out, bf16* out16, const float* gate, const float* up,
                                       std::int64_t n) {
  const std::int64_t nvec = n / 4;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t start = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool vec_ok = aligned16<float>(out) && aligned16<float>(gate) && aligned16<float>(up) &&
                      (reinterpret_cast<std::uintptr_t>(out16) & 7u) == 0;
  std::int64_t tail_begin = 0;
  const SwiGluOp op;
  if (vec_ok) {
    for (std::int64_t i = start; i < nvec; i += stride) {
      const float4 g = reinterpret_cast<const float4*>(gate)[i];
      const float4 u = reinterpret_cast<const float4*>(up)[i];
      float4 o;
      o.x = op(g.x, u.x);
      o.y = op(g.y, u.y);
      o.z = op(g.z, u.z);
      o.w = op(g.w, u.w);
      reinterpret_cast<float4*>(out)[i] = o;
      Bf16x4 o16;
      o16.v[0] = from_f32<bf16>(o.x);
      o16.v[1] = from_f32<bf16>(o.y);
      o16.v[2] = from_f32<bf16>(o.z);
      o16.v[3] = from_f32<bf16>(o.w);
      reinterpret_cast<Bf16x4*>(out16)[i] = o16;
    }
    tail_begin = nvec * 4;
  }
  for (std::int64_t i = tail_begin + start; i < n; i += stride) {
    const float o = op(gate[i], up[i]);
    out[i] = o;
    out16[i] = from_f32<bf16>(o);
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* d_gate, T* d_up, const T* d_out, const T* gate,
                                       const T* up, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float g = to_f32(gate[i]), u = to_f32(up[i]), dy = to_f32(d_out[i]);
    const float s = 1.0f / (1.0f + __expf(-g));
    d_up[i] = from_f32<T>(dy * g * s);
    d_gate[i] = from_f32<T>(dy * u * s * (1.0f + g * (1.0f - s)));
  }
}

__device__ __forceinline__ float adamw_one(float& w, float& m, float& v, float grad,
                                           const AdamWParams& p) {
  const float g = grad * p.grad_scale;
  m = p.beta1 * m + (1.0f - p.beta1) * g;
  v = p.beta2 * v + (1.0f - p.beta2) * g * g;
  const float mhat = m / p.bc1;
  const float vhat = v / p.bc2;
  w -= p.lr * (mhat / (sqrtf(vhat) + p.eps) + p.weight_decay * w);
  return w;
}

// kVec: float4 accesses over n / 4 elements (the launcher checks alignment and n % 4 == 0).
template <bool kVec>
__global__ void adamw_kernel(float* __restrict__ param, float* __restrict__ m,
                             float* __restrict__ v, bf16* __restrict__ param_bf16,
                             const float* __restrict__ grad, std::int64_t n, AdamWParams p) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t start = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (kVec) {
    for (std::int64_t i = start; i < n / 4; i += stride) {
      float4 w = reinterpret_cast<float4*>(param)[i];
      float4 mm = reinterpret_cast<float4*>(m)[i];
      float4 vv = reinterpret_cast<float4*>(v)[i];
      const float4 g = reinterpret_cast<const float4*>(grad)[i];
      adamw_one(w.x, mm.x, vv.x, g.x, p);
      adamw_one(w.y, mm.y, vv.y, g.y, p);
      adamw_one(w.z, mm.z, vv.z, g.z, p);
      adamw_one(w.w, mm.w, vv.w, g.w, p);
      reinterpret_cast<float4*>(param)[i] = w;
      reinterpret_cast<float4*>(m)[i] = mm;
      reinterpret_cast<float4*>(v)[i] = vv;
      if (param_bf16 != nullptr) {
        __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(param_bf16 + 4 * i);
        o[0] = __floats2bfloat162_rn(w.x, w.y);
        o[1] = __floats2bfloat162_rn(w.z, w.w);
      }
    }
  } else {
    for (std::int64_t i = start; i < n; i += stride) {
      float w = param[i], mm = m[i], vv = v[i];
      adamw_one(w, mm, vv, grad[i], p);
      param[i] = w;
      m[i] = mm;
      v[i] = vv;
      if (param_bf16 != nullptr) param_bf16[i] = __float2bfloat16_rn(w);
    }
  }
}

// Block b sums the squares of its slice x[b*chunk, min(n, (b+1)*chunk)): every element lands in
// the same thread's accumulator and the block reduction has a fixed order, so the sum is bitwise
// deterministic run to run (the stream trainer's clipping and exact resume rely on it). With one
// block (chunk = n) the result goes to out; with a grid, to partials[b], which
// sum_partials_kernel adds in index order. One block alone streams at a single SM's rate (the
// trainer measured ~25 GB/s: 12 ms per 3B-model layer's gradient), hence the grid when the
// caller gives scratch.
template <typename T>
__global__ void sum_squares_kernel(float* out, const T* x, std::int64_t n, std::int64_t chunk) {
  __shared__ float scratch[32];
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x) * chunk;
  const std::int64_t end = begin + chunk < n ? begin + chunk : n;
  float acc0 = 0.0f, acc1 = 0.0f;
  const std::int64_t stride = 2 * static_cast<std::int64_t>(blockDim.x);
  std::int64_t i = begin + threadIdx.x;
  for (; i + blockDim.x < end; i += stride) {  // two independent chains hide load latency
    const float a = to_f32(x[i]), b = to_f32(x[i + blockDim.x]);
    acc0 = fmaf(a, a, acc0);
    acc1 = fmaf(b, b, acc1);
  }
  if (i < end) {
    const float a = to_f32(x[i]);
    acc0 = fmaf(a, a, acc0);
  }
  const float total = block_sum(acc0 + acc1, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

__global__ void sum_partials_kernel(float* out, const float* partials, int count) {
  __shared__ float scratch[32];
  const float v = static_cast<int>(threadIdx.x) < count ? partials[threadIdx.x] : 0.0f;
  const float total = block_sum(v, scratch);
  if (threadIdx.x == 0) *out = total;
}

// out[i] = in[i] converted (f32 -> bf16: __float2bfloat16_rn, round to nearest even).
template <typename To, typename From>
__global__ void convert_kernel(To* __restrict__ out, const From* __restrict__ in, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = from_f32<To>(to_f32(in[i]));
}

unsigned blocks_for(std::int64_t n) {
  // Enough blocks to fill the device several times over; grid-stride covers the rest.
  return grid_for(n, kThreads, 132LL * 16);
}

}  // namespace

cudaError_t launch_add(Elt e, void* out, const void* a, const void* b, std::int64_t n,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    binary_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n, AddOp{});
  });
}

cudaError_t launch_swiglu(Elt e, void* out, const void* gate, const void* up, std::int64_t n,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    binary_kernel<T>
        <<<blocks_for(n), kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(gate),
                                                 static_cast<const T*>(up), n, SwiGluOp{});
  });
}

cudaError_t launch_swiglu_f32_bf16(float* out, void* out16, const float* gate, const float* up,
                                   std::int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  swiglu_f32_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, static_cast<bf16*>(out16),
                                                                 gate, up, n);
  return cudaGetLastError();
}

cudaError_t launch_swiglu_backward(Elt e, void* d_gate, void* d_up, const void* d_out,
                                   const void* gate, const void* up, std::int64_t n,
                                   cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    swiglu_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<T*>(d_gate), static_cast<T*>(d_up), static_cast<const T*>(d_out),
        static_cast<const T*>(gate), static_cast<const T*>(up), n);
  });
}

cudaError_t launch_adamw(float* param, float* m, float* v, void* param_bf16, const float* grad,
                         std::int64_t n, AdamWParams p, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  auto al = [](const void* q) { return (reinterpret_cast<std::uintptr_t>(q) & 15u) == 0; };
  const bool vec =
      n % 4 == 0 && al(param) && al(m) && al(v) && al(grad) &&
      (param_bf16 == nullptr || (reinterpret_cast<std::uintptr_t>(param_bf16) & 7u) == 0);
  if (vec) {
    adamw_kernel<true><<<blocks_for(n / 4), kThreads, 0, stream>>>(
        param, m, v, static_cast<bf16*>(param_bf16), grad, n, p);
  } else {
    adamw_kernel<false><<<blocks_for(n), kThreads, 0, stream>>>(
        param, m, v, static_cast<bf16*>(param_bf16), grad, n, p);
  }
  return cudaGetLastError();
}

cudaError_t launch_convert(Elt e_out, void* out, Elt e_in, const void* in, std::int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch_elt(e_out, [&](auto out_tag) {
    using To = decltype(out_tag);
    (void)dispatch_elt(e_in, [&](auto in_tag) {
      using From = decltype(in_tag);
      convert_kernel<To, From><<<blocks_for(n), kThreads, 0, stream>>>(
          static_cast<To*>(out), static_cast<const From*>(in), n);
    });
  });
}

cudaError_t launch_sum_squares(Elt e, float* out, const void* x, std::int64_t n, float* partials,
                               cudaStream_t stream) {
  if (n == 0) return cudaMemsetAsync(out, 0, sizeof(float), stream);
  // Slices of at least 64 Ki elements (below that one block is as fast as a grid); the grid size
  // is a function of n alone, so a given x always sums in the same order.
  constexpr std::int64_t kMinSlice = std::int64_t{1} << 16;
  const std::int64_t blocks =
      partials == nullptr
          ? 1
          : std::min<std::int64_t>(kSumSquaresBlocks, (n + kMinSlice - 1) / kMinSlice);
  const std::int64_t chunk = (n + blocks - 1) / blocks;
  return dispatch_elt(e, [&](auto tag) {
    using T = decltype(tag);
    if (blocks == 1) {
      sum_squares_kernel<T><<<1, 1024, 0, stream>>>(out, static_cast<const T*>(x), n, n);
      return;
    }
    sum_squares_kernel<T><<<static_cast<unsigned>(blocks), 1024, 0, stream>>>(
        partials, static_cast<const T*>(x), n, chunk);
    sum_partials_kernel<<<1, kSumSquaresBlocks, 0, stream>>>(out, partials,
                                                             static_cast<int>(blocks));
  });
}

}  // namespace ferry::kernels::cuda
