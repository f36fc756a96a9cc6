// SPDX-License-Identifier: Apache-2.0
// Device twin of the hybrid AdamW span kernel: see hybrid_adamw_cuda.h. This file is compiled
// with --fmad=false (src/kernels/CMakeLists.txt): the CPU kernels never contract a*b+c, so the
// device must not either.
#include "kernels/cpu/hybrid_adamw_scalar.h"
#include "kernels/cuda/hybrid_adamw_cuda.h"

namespace ferry::kernels::cuda {
namespace {

namespace q8 = cpu::q8;
using cpu::AdamWConstants;
using cpu::HybridAdamWSpan;
using cpu::MasterKind;

constexpr int kThreads = 256;

template <MasterKind MK>
__global__ void hybrid_f32_states_kernel(AdamWConstants k, HybridAdamWSpan s) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < s.n;
       i += stride) {
    float mi, vi;
    cpu::hybrid::step_element<MK>(k, s, i, s.m32[i], s.v32[i], mi, vi);
    s.m32[i] = mi;
    s.v32[i] = vi;
  }
}

// The scalar loop's `x > acc ? x : acc` over the block, as a tree: the values are finite and
// >= +0 (|m| and sqrt(v)), so any order gives the same maximum.
__device__ __forceinline__ float max_of(float a, float b) { return a > b ? a : b; }

__device__ float block_max(float x, float* red) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = max_of(x, __shfl_xor_sync(0xffffffffu, x, off));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = x;
  __syncthreads();
  float r = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) r = max_of(red[w], r);
  return r;
}

// One CTA per 8-bit block (q8::kBlock elements): pass A decodes, steps and keeps the new m and
// sqrt(v) in shared memory while folding the block maxima; pass B encodes with the new
// multipliers — the scalar kernel's two passes over the same block.
template <MasterKind MK>
__global__ void __launch_bounds__(kThreads) hybrid_q8_kernel(AdamWConstants k, HybridAdamWSpan s) {
  __shared__ float scratch_m[q8::kBlock];
  __shared__ float scratch_s[q8::kBlock];
  __shared__ float red_m[kThreads / 32];
  __shared__ float red_s[kThreads / 32];
  const std::int64_t blk = blockIdx.x;
  const std::int64_t b0 = blk * q8::kBlock;
  const std::int64_t b1 = s.n < b0 + q8::kBlock ? s.n : b0 + q8::kBlock;
  const float deq_m = q8::decode_multiplier<q8::kMBits>(s.m_absmax[blk]);
  const float deq_s = q8::decode_multiplier<q8::kVBits>(s.v_absmax[blk]);
  float amax_m = 0.0f, amax_s = 0.0f;
  for (std::int64_t i = b0 + threadIdx.x; i < b1; i += kThreads) {
    const float mo = q8::decode_m(s.m8[i], deq_m);
    const float so = q8::decode_s(s.v8[i], deq_s);
    float mi, vi, si;
    cpu::hybrid::step_element<MK, true>(k, s, i, mo, so * so, mi, vi, &si);
    scratch_m[i - b0] = mi;
    scratch_s[i - b0] = si;
    const float am = q8::float_of(q8::bits_of(mi) & 0x7fffffffu);
    amax_m = max_of(am, amax_m);
    amax_s = max_of(si, amax_s);
  }
  // Every thread read the old absmax above; the block_max barrier orders the write after them.
  amax_m = block_max(amax_m, red_m);
  amax_s = block_max(amax_s, red_s);
  if (threadIdx.x == 0) {
    s.m_absmax[blk] = amax_m;
    s.v_absmax[blk] = amax_s;
  }
  const float inv_m = q8::encode_multiplier<q8::kMBits>(amax_m);
  const float inv_s = q8::encode_multiplier<q8::kVBits>(amax_s);
  for (std::int64_t i = b0 + threadIdx.x; i < b1; i += kThreads) {
    s.m8[i] = q8::encode_m(scratch_m[i - b0], inv_m);
    s.v8[i] = q8::encode_s(scratch_s[i - b0], inv_s);
  }
}

template <MasterKind MK>
cudaError_t launch_t(cpu::StateKind states, const AdamWConstants& k, const HybridAdamWSpan& s,
                     cudaStream_t stream) {
  if (states == cpu::StateKind::kF32) {
    const std::int64_t blocks = (s.n + kThreads - 1) / kThreads;
    const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
    hybrid_f32_states_kernel<MK><<<grid, kThreads, 0, stream>>>(k, s);
  } else {
    const auto grid = static_cast<unsigned>((s.n + q8::kBlock - 1) / q8::kBlock);
    hybrid_q8_kernel<MK><<<grid, kThreads, 0, stream>>>(k, s);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_hybrid_adamw(cpu::MasterKind master, cpu::StateKind states,
                                const cpu::AdamWConstants& k, const cpu::HybridAdamWSpan& s,
                                cudaStream_t stream) {
  const bool f32_states = states == cpu::StateKind::kF32;
  if (s.n < 0 || (s.n > 0 && s.grad == nullptr)) return cudaErrorInvalidValue;
  if (master == MasterKind::kF32) {
    if (f32_states || s.p32 == nullptr || s.comp16 != nullptr) return cudaErrorInvalidValue;
  } else if (s.p16 == nullptr || (master == MasterKind::kBf16Kahan) != (s.comp16 != nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (f32_states ? (s.m32 == nullptr || s.v32 == nullptr)
                 : (s.m8 == nullptr || s.v8 == nullptr || s.m_absmax == nullptr ||
                    s.v_absmax == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (s.n == 0) return cudaSuccess;
  switch (master) {
    case MasterKind::kF32:
      return launch_t<MasterKind::kF32>(states, k, s, stream);
    case MasterKind::kBf16Kahan:
      return launch_t<MasterKind::kBf16Kahan>(states, k, s, stream);
    case MasterKind::kBf16Sr:
      return launch_t<MasterKind::kBf16Sr>(states, k, s, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ferry::kernels::cuda
