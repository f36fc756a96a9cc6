// SPDX-License-Identifier: Apache-2.0
// Flash-style attention forward (FlashAttention-2 algorithm, our own code): causal or not,
// grouped-query, packed varlen (cu_seqlens), bf16 in/out, f32 accumulation, D in {64, 128}.
// One CTA = 64 query rows of one head (4 warps x 16 rows); it streams 64-key tiles of K and V
// through double-buffered shared memory (cp.async: tile j+1 loads while tile j is computed),
// keeps S, P and O in registers (mma.sync m16n8k16), and uses the online softmax in the log2
// domain, so no T x T matrix ever exists. Causal: a sequence's last query blocks (the most key
// tiles) are scheduled first, so the short blocks fill the tail of the grid. Writes lse =
// log-sum-exp of the scaled scores (natural log) for the backward. Deterministic (no atomics, fixed
// order). Tested in tests/gpu/kernels_attention_test.cpp against the reference backend.
#include "kernels/cuda/attention_common.cuh"

namespace ferry::kernels::cuda {
namespace {

using namespace attn;

constexpr int kBM = 64;  // query rows per CTA
constexpr int kBN = 64;  // keys per tile

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_fwd_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                         const bf16* __restrict__ q, const bf16* __restrict__ k,
                         const bf16* __restrict__ v, const std::int32_t* __restrict__ cu,
                         AttnShape sh, float scale_log2) {
  constexpr int kStr = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);
  // Buffer b of K is kbuf + b * kTile (pointer arithmetic, not a pointer array: an indexed
  // array would live in local memory).
  constexpr int kTile = kBN * kStr;
  bf16* const kbuf = qs + kBM * kStr;
  bf16* const vbuf = kbuf + 2 * kTile;

  SeqBlock sb;
  if (!find_block(cu, sh.s, kBM, blockIdx.x, &sb)) return;
  if (sh.causal) sb.block = sb.blocks - 1 - sb.block;  // heavy blocks first
  const std::int64_t h = blockIdx.y;
  const std::int64_t kvh = h / (sh.h / sh.g);
  const std::int64_t s0 = sb.start, len = sb.len, q0 = sb.block * kBM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;

  const std::int64_t kend = sh.causal ? min(len, q0 + kBM) : len;
  const std::int64_t tiles = (kend + kBN - 1) / kBN;
  load_rows_async<D>(qs, q, s0, q0, len, kBM, sh.h, h);
  if (tiles > 0) {
    load_rows_async<D>(kbuf, k, s0, 0, len, kBN, sh.g, kvh);
    load_rows_async<D>(vbuf, v, s0, 0, len, kBN, sh.g, kvh);
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  std::uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) load_a(qf[kk], qs, kStr, warp * 16, kk);

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const std::int64_t qi[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};

  for (std::int64_t j = 0; j < tiles; ++j) {
    const std::int64_t k0 = j * kBN;
    if (j > 0) {
      cp_async_wait_all();  // tile j landed (this thread's part) ...
      __syncthreads();      // ... and everyone's; everyone is also done with tile j - 1
    }
    if (j + 1 < tiles) {
      load_rows_async<D>(kbuf + ((j + 1) & 1) * kTile, k, s0, k0 + kBN, len, kBN, sh.g, kvh);
      load_rows_async<D>(vbuf + ((j + 1) & 1) * kTile, v, s0, k0 + kBN, len, kBN, sh.g, kvh);
    }
    cp_async_commit();
    const bf16* ks = kbuf + (j & 1) * kTile;
    const bf16* vs = vbuf + (j & 1) * kTile;

    float s[kBN / 8][4];
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nt = 0; nt < kBN / 8; nt += 2) {
        std::uint32_t b[4];
        ldmatrix_b_pair(b, ks, kStr, nt * 8, kk);
        mma_bf16(s[nt], qf[kk], b[0], b[1]);
        mma_bf16(s[nt + 1], qf[kk], b[2], b[3]);
      }
    }
    // Only the diagonal tile (causal) and the sequence's last tile need a mask.
    const bool masked = k0 + kBN > len || (sh.causal && k0 + kBN > q0);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const std::int64_t kj = k0 + nt * 8 + 2 * t + (e & 1);
        const int r = e >> 1;
        const bool ok = !masked || (kj < len && (!sh.causal || kj <= qi[r]));
        const float x = ok ? s[nt][e] * scale_log2 : -INFINITY;
        s[nt][e] = x;
        mx[r] = fmaxf(mx[r], x);
      }
    }
    float alpha[2], mu[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mn = fmaxf(m[r], mx[r]);
      mu[r] = mn == -INFINITY ? 0.0f : mn;
      alpha[r] = fast_exp2(m[r] - mu[r]);
      m[r] = mn;
    }
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = fast_exp2(s[nt][e] - mu[e >> 1]);
        s[nt][e] = p;
        rs[e >> 1] += p;
      }
    }
    l[0] = l[0] * alpha[0] + rs[0];
    l[1] = l[1] * alpha[1] + rs[1];
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      o[nd][0] *= alpha[0];
      o[nd][1] *= alpha[0];
      o[nd][2] *= alpha[1];
      o[nd][3] *= alpha[1];
    }
#pragma unroll
    for (int kc = 0; kc < kBN / 16; ++kc) {
      std::uint32_t a[4];
      c_to_a(a, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        std::uint32_t b0, b1;
        ldmatrix_b_trans(b0, b1, vs + kc * 16 * kStr + nd * 8, kStr);
        mma_bf16(o[nd], a, b0, b1);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    if (qi[r] >= len) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    bf16* dst = out + ((s0 + qi[r]) * sh.h + h) * D + 2 * t;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const std::uint32_t pk = pack_bf16(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
      *reinterpret_cast<std::uint32_t*>(dst + nd * 8) = pk;
    }
    if (lse != nullptr && t == 0)
      lse[h * sh.t + s0 + qi[r]] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * kLn2 : -INFINITY;
  }
}

template <int D>
cudaError_t launch_fwd_d(void* out, float* lse, const void* q, const void* k, const void* v,
                         const std::int32_t* cu, AttnShape sh, cudaStream_t stream) {
  constexpr int kStr = D + 8;
  const int smem = (kBM + 4 * kBN) * kStr * static_cast<int>(sizeof(bf16));
  cudaError_t err = cudaFuncSetAttribute(attention_fwd_kernel<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(grid_blocks(sh.t, sh.s, kBM), static_cast<unsigned>(sh.h));
  attention_fwd_kernel<D><<<grid, kThreads, smem, stream>>>(
      static_cast<bf16*>(out), lse, static_cast<const bf16*>(q), static_cast<const bf16*>(k),
      static_cast<const bf16*>(v), cu, sh, sh.scale * kLog2e);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_attention_fwd(void* out, float* lse, const void* q, const void* k, const void* v,
                                 const std::int32_t* cu_seqlens, AttnShape sh,
                                 cudaStream_t stream) {
  if (sh.t == 0) return cudaSuccess;
  switch (sh.d) {
    case 64:
      return launch_fwd_d<64>(out, lse, q, k, v, cu_seqlens, sh, stream);
    case 128:
      return launch_fwd_d<128>(out, lse, q, k, v, cu_seqlens, sh, stream);
    default:
      return cudaErrorInvalidValue;  // the backend reports unimplemented before getting here
  }
}

}  // namespace ferry::kernels::cuda
