// SPDX-License-Identifier: Apache-2.0
// The attention forward with sm_90a warpgroup MMAs (D = 64 / 128; the default where the build and
// the device have sm_90a and no other forward variant is asked for; FERRY_ATTN_FWD_WGMMA=0 turns
// it off; attention_fwd.cu launches it).
//
// Same algorithm as attention_fwd_kernel's default (FlashAttention-2 with the conditional "lazy"
// rescale, 64-key tiles, log2-domain online softmax, lse out, causal heavy blocks first), same
// rows per CTA (128: two warpgroups of 64, warp w of a warpgroup owning its rows 16w .. 16w + 15
// as the wgmma accumulator layout has them, wgmma.cuh), but the two products per tile are
// warpgroup MMAs whose operands the tensor cores read from 128-byte-swizzled shared-memory tiles:
//   S  = Q K^T   m64 n64 over D / 16 k steps, A = the warpgroup's Q rows, B = the K tile (K-major)
//   O += P V     m64 nD over 4 k steps, A = P from registers, B = the V tile (MN-major)
// K and V tiles are double-buffered by cp.async as before. Deterministic (fixed order).
#include <cstdint>

#include "kernels/cuda/attention_wgmma.cuh"

namespace ferry::kernels::cuda::attn {
namespace {

constexpr int kRows = 128;        // query rows per CTA (two warpgroups)
constexpr int kKeysPerTile = 64;  // keys per K / V tile
constexpr int kFwdThreads = 256;

template <int D>
struct FwdSmem {
  static constexpr int kQBytes = kRows * D * 2;
  static constexpr int kTileBytes = kKeysPerTile * D * 2;
  static constexpr int kBytes = kQBytes + 4 * kTileBytes + 1024;  // Q, 2 x K, 2 x V; alignment
};

template <int D>
__global__ void __launch_bounds__(kFwdThreads, 2)
    attention_fwd_wgmma_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                               const bf16* __restrict__ q, const bf16* __restrict__ k,
                               const bf16* __restrict__ v, const std::int32_t* __restrict__ cu,
                               AttnShape sh, float scale_log2) {
#if FERRY_WGMMA_ENABLED
  constexpr float kLazyLog2 = 8.0f;  // attention_fwd.cu's kLazyRescaleLog2
  constexpr int kBN = kKeysPerTile;
  constexpr int kTile = FwdSmem<D>::kTileBytes;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* const qs = align1024(smem_raw);
  unsigned char* const kbuf = qs + FwdSmem<D>::kQBytes;  // buffer b at kbuf + b * kTile
  unsigned char* const vbuf = kbuf + 2 * kTile;

  SeqBlock sb;
  if (!find_block(cu, sh.s, kRows, blockIdx.x, &sb)) return;
  if (sh.causal) sb.block = sb.blocks - 1 - sb.block;  // heavy blocks first
  const std::int64_t h = blockIdx.y;
  const std::int64_t kvh = h / (sh.h / sh.g);
  const std::int64_t s0 = sb.start, len = sb.len, q0 = sb.block * kRows;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const std::int64_t qg = q0 + wg * 64;     // this warpgroup's first row
  const std::int64_t qw = qg + warp * 16;   // this warp's first row
  const int len32 = static_cast<int>(len);  // positions fit in 32 bits (int32 cu_seqlens)
  const int qi[2] = {static_cast<int>(qw) + g, static_cast<int>(qw) + g + 8};

  const std::int64_t kend = sh.causal ? min(len, q0 + kRows) : len;
  const std::int64_t tiles = (kend + kBN - 1) / kBN;
  load_rows_swz<D>(qs, q, s0, q0, len, kRows, sh.h, h);
  if (tiles > 0) {
    load_rows_swz<D>(kbuf, k, s0, 0, len, kBN, sh.g, kvh);
    load_rows_swz<D>(vbuf, v, s0, 0, len, kBN, sh.g, kvh);
  }
  cp_async_commit();

  float o[D / 8][4];
  auto& o_f = *reinterpret_cast<float(*)[D / 2]>(&o[0][0]);
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (std::int64_t j = 0; j < tiles; ++j) {
    const std::int64_t k0 = j * kBN;
    cp_async_wait_all();
    wgmma::fence_proxy_async();
    // Tile j (and Q) landed for all; both warpgroups' MMAs on tile j - 1 completed (their waits).
    __syncthreads();
    if (j + 1 < tiles) {
      load_rows_swz<D>(kbuf + ((j + 1) & 1) * kTile, k, s0, k0 + kBN, len, kBN, sh.g, kvh);
      load_rows_swz<D>(vbuf + ((j + 1) & 1) * kTile, v, s0, k0 + kBN, len, kBN, sh.g, kvh);
    }
    cp_async_commit();
    // Causal: a tile entirely right of this warpgroup's last row contributes nothing to it
    // (warpgroup-uniform: its MMAs are collective over the 4 warps).
    if (sh.causal && k0 > qg + 63) continue;
    const unsigned char* ks = kbuf + (j & 1) * kTile;
    const unsigned char* vs = vbuf + (j & 1) * kTile;

    float s[kBN / 8][4];
    auto& s_f = *reinterpret_cast<float(*)[kBN / 2]>(&s[0][0]);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma::mma_ss_m64n64k16(s_f, wgmma::desc_kmajor(qs, kRows, wg * 64, kk),
                              wgmma::desc_kmajor(ks, kBN, 0, kk), kk > 0);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(s_f);

    // The lazy online softmax of attention_fwd_kernel<..., kLazy = true> with one m-tile per warp.
    const bool masked = k0 + kBN > len || (sh.causal && k0 + kBN > qw);
    if (masked) {
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kj = static_cast<int>(k0) + nt * 8 + 2 * t + (e & 1);
          if (!(kj < len32 && (!sh.causal || kj <= qi[e >> 1]))) s[nt][e] = -INFINITY;
        }
    }
    float mx[2];
    bool need = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float x = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) x = fmaxf(x, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
      mx[r] = x * scale_log2;
      need = need || mx[r] > m[r] + kLazyLog2;
    }
    if (__any_sync(0xffffffffu, need)) {
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const bool moves = mx[r] > m[r] + kLazyLog2;
        alpha[r] = moves ? fast_exp2(m[r] - mx[r]) : 1.0f;
        if (moves) m[r] = mx[r];
        l[r] *= alpha[r];
      }
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        o[nd][0] *= alpha[0];
        o[nd][1] *= alpha[0];
        o[nd][2] *= alpha[1];
        o[nd][3] *= alpha[1];
      }
    }
    const float mu[2] = {m[0] == -INFINITY ? 0.0f : m[0], m[1] == -INFINITY ? 0.0f : m[1]};
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = fast_exp2(fmaf(s[nt][e], scale_log2, -mu[e >> 1]));
        s[nt][e] = p;
        rs[e >> 1] += p;
      }
    }
    l[0] += rs[0];
    l[1] += rs[1];

    std::uint32_t a[kBN / 16][4];
#pragma unroll
    for (int kc = 0; kc < kBN / 16; ++kc) c_to_a(a[kc], s[2 * kc], s[2 * kc + 1]);
    wgmma::fence();  // O was rescaled and P packed by ordinary instructions
#pragma unroll
    for (int kc = 0; kc < kBN / 16; ++kc) {
      wgmma::mma_rs_bmn<D>(o_f, a[kc], wgmma::desc_mnmajor(vs, kBN, kc * 16));
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(o_f);
  }
  cp_async_wait_all();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lr = l[r];
    lr += __shfl_xor_sync(0xffffffffu, lr, 1);
    lr += __shfl_xor_sync(0xffffffffu, lr, 2);
    const std::int64_t row = qi[r];
    if (row >= len) continue;
    const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
    bf16* dst = out + ((s0 + row) * sh.h + h) * D + 2 * t;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      *reinterpret_cast<std::uint32_t*>(dst + nd * 8) =
          pack_bf16(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
    if (lse != nullptr && t == 0)
      lse[h * sh.t + s0 + row] = lr > 0.0f ? (m[r] + log2f(lr)) * kLn2 : -INFINITY;
  }
#else
  (void)out, (void)lse, (void)q, (void)k, (void)v, (void)cu, (void)sh, (void)scale_log2;
  __trap();  // never launched: wgmma_available() is false without sm_90a
#endif
}

template <int D>
cudaError_t launch_d(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                     const std::int32_t* cu, AttnShape sh, cudaStream_t stream) {
  constexpr int kSmem = FwdSmem<D>::kBytes;
  cudaError_t err = cudaFuncSetAttribute(attention_fwd_wgmma_kernel<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid(grid_blocks(sh.t, sh.s, kRows), static_cast<unsigned>(sh.h));
  attention_fwd_wgmma_kernel<D>
      <<<grid, kFwdThreads, kSmem, stream>>>(out, lse, q, k, v, cu, sh, sh.scale * kLog2e);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_fwd_wgmma(void* out, float* lse, const void* q, const void* k, const void* v,
                             const std::int32_t* cu, AttnShape sh, cudaStream_t stream) {
  auto* o = static_cast<bf16*>(out);
  const auto* qq = static_cast<const bf16*>(q);
  const auto* kk = static_cast<const bf16*>(k);
  const auto* vv = static_cast<const bf16*>(v);
  switch (sh.d) {
    case 64:
      return launch_d<64>(o, lse, qq, kk, vv, cu, sh, stream);
    case 128:
      return launch_d<128>(o, lse, qq, kk, vv, cu, sh, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace ferry::kernels::cuda::attn
