// SPDX-License-Identifier: Apache-2.0
// Flash-style attention forward (FlashAttention-2 algorithm, our own code): causal or not,
// grouped-query, packed varlen (cu_seqlens), bf16 in/out, f32 accumulation, D in {16, 32, 64, 128}.
// One CTA = 64 query rows of one head (4 warps x 16 rows); it streams 64-key tiles of K and V
// through double-buffered shared memory (cp.async: tile j+1 loads while tile j is computed),
// keeps S, P and O in registers (mma.sync m16n8k16), and uses the online softmax in the log2
// domain, so no T x T matrix ever exists. Causal: a sequence's last query blocks (the most key
// tiles) are scheduled first, so the short blocks fill the tail of the grid. Writes lse =
// log-sum-exp of the scaled scores (natural log) for the backward. Deterministic (no atomics, fixed
// order). Tested in tests/gpu/kernels_attention_test.cpp against the reference backend.
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_wgmma.cuh"

namespace ferry::kernels::cuda {
namespace {

using namespace attn;

// Each warp owns kMT m-tiles (16 * kMT query rows), so every K and V fragment read from shared
// memory feeds kMT MMAs (FA2's reuse); the CTA's 4 warps cover kBM = 64 * kMT rows. S, P and O are
// in registers. kQRegs: the Q fragments stay in registers for the whole key loop (kMT * D / 4
// registers: 64 at D = 128 with 2 m-tiles, which with O's 128 pushed that variant to 255 registers
// and spills); otherwise they are re-read from the (resident) Q tile in shared memory, one
// ldmatrix.x4 per m-tile and k-chunk, and V's B fragments come two n-tiles per ldmatrix.x4.trans.
// kLazy (the default; FERRY_ATTN_FWD_LAZY=0 turns it off, launch_attention_fwd): the online
// softmax keeps a row's running max m until a tile's max exceeds it by more than
// kLazyRescaleLog2 (in the log2 domain), so P = 2^(s - m) <= 2^8 in bf16 (same relative
// rounding) and O, l are rescaled only when some row of the warp moves its max — a warp-uniform
// branch that skips the O-rescale's kMT * D / 2 multiplies per lane and tile in the common case
// (FlashAttention-4's conditional rescaling). The max is taken over the raw scores and scaled
// once, P is one FFMA + ex2 per element (s * scale - m), and masked tiles are masked in a
// separate pass. The result is the same softmax (l and O carry the same stale max; lse = m +
// log2 l); bits differ from the default's rounding, within the tests' tolerance rule.
constexpr float kLazyRescaleLog2 = 8.0f;

// O's C fragments of one m-tile: rows g (c0, c1) times alpha[0], rows g + 8 (c2, c3) times
// alpha[1].
template <int D>
__device__ __forceinline__ void rescale_rows(float (&o)[D / 8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int nd = 0; nd < D / 8; ++nd) {
    o[nd][0] *= alpha[0];
    o[nd][1] *= alpha[0];
    o[nd][2] *= alpha[1];
    o[nd][3] *= alpha[1];
  }
}

template <int D, int kMT, int kBN, bool kQRegs, bool kLazy>
__global__ void __launch_bounds__(kThreads)
    attention_fwd_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                         const bf16* __restrict__ q, const bf16* __restrict__ k,
                         const bf16* __restrict__ v, const std::int32_t* __restrict__ cu,
                         AttnShape sh, float scale_log2) {
  constexpr int kBM = 64 * kMT;
  constexpr int kWarpRows = 16 * kMT;
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
  const std::int64_t qw = q0 + warp * kWarpRows;  // this warp's first row

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
  // kQRegs: every k-chunk's Q fragment, loaded once; else one k-chunk's, reloaded per use.
  constexpr int kQChunks = kQRegs ? D / 16 : 1;
  std::uint32_t qf[kMT][kQChunks][4];
  if constexpr (kQRegs) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        load_a(qf[mt][kk], qs, kStr, warp * kWarpRows + mt * 16, kk);
  }

  float o[kMT][D / 8][4];
  float m[kMT][2], l[kMT][2];
  // Positions within the sequence fit in 32 bits (cu_seqlens is int32): the mask math is in int.
  const int len32 = static_cast<int>(len);
  int qi[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
    qi[mt][0] = static_cast<int>(qw) + mt * 16 + g;
    qi[mt][1] = static_cast<int>(qw) + mt * 16 + g + 8;
  }

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
    // Causal: a tile entirely right of this warp's last row contributes nothing to it.
    if (sh.causal && k0 > qw + kWarpRows - 1) continue;
    const bf16* ks = kbuf + (j & 1) * kTile;
    const bf16* vs = vbuf + (j & 1) * kTile;

    float s[kMT][kBN / 8][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int i = 0; i < kBN / 8; ++i)
        s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      if constexpr (!kQRegs) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
          ldmatrix_a(qf[mt][0], qs, kStr, warp * kWarpRows + mt * 16, kk);
      }
      const int qk = kQRegs ? kk : 0;
#pragma unroll
      for (int nt = 0; nt < kBN / 8; nt += 2) {
        std::uint32_t b[4];
        ldmatrix_b_pair(b, ks, kStr, nt * 8, kk);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_bf16(s[mt][nt], qf[mt][qk], b[0], b[1]);
          mma_bf16(s[mt][nt + 1], qf[mt][qk], b[2], b[3]);
        }
      }
    }
    // Only the diagonal tiles (causal) and the sequence's last tile need a mask.
    const bool masked = k0 + kBN > len || (sh.causal && k0 + kBN > qw);
    if constexpr (kLazy) {
      if (masked) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int nt = 0; nt < kBN / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int kj = static_cast<int>(k0) + nt * 8 + 2 * t + (e & 1);
              if (!(kj < len32 && (!sh.causal || kj <= qi[mt][e >> 1]))) {
                s[mt][nt][e] = -INFINITY;
              }
            }
      }
      // Row maxima of the raw scores, scaled once (scale_log2 > 0 keeps the order).
      float mx[kMT][2];
      bool need = false;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float v = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < kBN / 8; ++nt)
            v = fmaxf(v, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
          v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
          mx[mt][r] = v * scale_log2;
          // m = -inf (nothing seen yet): any finite max moves it.
          need = need || mx[mt][r] > m[mt][r] + kLazyRescaleLog2;
        }
      }
      if (__any_sync(0xffffffffu, need)) {  // warp-uniform: the rows that moved are rescaled
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          float alpha[2];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const bool moves = mx[mt][r] > m[mt][r] + kLazyRescaleLog2;
            alpha[r] = moves ? fast_exp2(m[mt][r] - mx[mt][r]) : 1.0f;  // 2^-inf = 0
            if (moves) m[mt][r] = mx[mt][r];
            l[mt][r] *= alpha[r];
          }
          rescale_rows<D>(o[mt], alpha);
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        // A row with nothing unmasked yet keeps m = -inf: its p are 2^(-inf - 0) = 0.
        const float mu[2] = {m[mt][0] == -INFINITY ? 0.0f : m[mt][0],
                             m[mt][1] == -INFINITY ? 0.0f : m[mt][1]};
        float rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float p = fast_exp2(fmaf(s[mt][nt][e], scale_log2, -mu[e >> 1]));
            s[mt][nt][e] = p;
            rs[e >> 1] += p;
          }
        }
        l[mt][0] += rs[0];
        l[mt][1] += rs[1];
      }
    } else {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int kj = static_cast<int>(k0) + nt * 8 + 2 * t + (e & 1);
            const int r = e >> 1;
            const bool ok = !masked || (kj < len32 && (!sh.causal || kj <= qi[mt][r]));
            const float x = ok ? s[mt][nt][e] * scale_log2 : -INFINITY;
            s[mt][nt][e] = x;
            mx[r] = fmaxf(mx[r], x);
          }
        }
        float alpha[2], mu[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          const float mn = fmaxf(m[mt][r], mx[r]);
          mu[r] = mn == -INFINITY ? 0.0f : mn;
          alpha[r] = fast_exp2(m[mt][r] - mu[r]);
          m[mt][r] = mn;
        }
#pragma unroll
        for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float p = fast_exp2(s[mt][nt][e] - mu[e >> 1]);
            s[mt][nt][e] = p;
            rs[e >> 1] += p;
          }
        }
        l[mt][0] = l[mt][0] * alpha[0] + rs[0];
        l[mt][1] = l[mt][1] * alpha[1] + rs[1];
        rescale_rows<D>(o[mt], alpha);
      }
    }
#pragma unroll
    for (int kc = 0; kc < kBN / 16; ++kc) {
      std::uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) c_to_a(a[mt], s[mt][2 * kc], s[mt][2 * kc + 1]);
      if constexpr (kQRegs) {
#pragma unroll
        for (int nd = 0; nd < D / 8; ++nd) {
          std::uint32_t b0, b1;
          ldmatrix_b_trans(b0, b1, vs + kc * 16 * kStr + nd * 8, kStr);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) mma_bf16(o[mt][nd], a[mt], b0, b1);
        }
      } else {
#pragma unroll
        for (int nd = 0; nd < D / 8; nd += 2) {
          std::uint32_t b[4];
          ldmatrix_b_trans_pair(b, vs + kc * 16 * kStr + nd * 8, kStr);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_bf16(o[mt][nd], a[mt], b[0], b[1]);
            mma_bf16(o[mt][nd + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
  }
  cp_async_wait_all();

#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const std::int64_t row = qi[mt][r];
      if (row >= len) continue;
      const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
      bf16* dst = out + ((s0 + row) * sh.h + h) * D + 2 * t;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        const std::uint32_t pk = pack_bf16(o[mt][nd][2 * r] * inv, o[mt][nd][2 * r + 1] * inv);
        *reinterpret_cast<std::uint32_t*>(dst + nd * 8) = pk;
      }
      if (lse != nullptr && t == 0)
        lse[h * sh.t + s0 + row] = lr > 0.0f ? (m[mt][r] + log2f(lr)) * kLn2 : -INFINITY;
    }
  }
}

template <int D, int kMT, int kBN, bool kQRegs = true, bool kLazy = false>
cudaError_t launch_fwd_d(void* out, float* lse, const void* q, const void* k, const void* v,
                         const std::int32_t* cu, AttnShape sh, cudaStream_t stream) {
  constexpr int kStr = D + 8;
  constexpr int kBM = 64 * kMT;
  const int smem = (kBM + 4 * kBN) * kStr * static_cast<int>(sizeof(bf16));
  cudaError_t err = cudaFuncSetAttribute(attention_fwd_kernel<D, kMT, kBN, kQRegs, kLazy>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const dim3 grid(grid_blocks(sh.t, sh.s, kBM), static_cast<unsigned>(sh.h));
  attention_fwd_kernel<D, kMT, kBN, kQRegs, kLazy><<<grid, kThreads, smem, stream>>>(
      static_cast<bf16*>(out), lse, static_cast<const bf16*>(q), static_cast<const bf16*>(k),
      static_cast<const bf16*>(v), cu, sh, sh.scale * kLog2e);
  return cudaGetLastError();
}

// Forward variants, chosen at every launch from the environment (a getenv per call, so one
// benchmark build A/Bs them and a test can switch them):
//   FERRY_ATTN_FWD_MT=1     16 rows per warp, Q in registers, 64-key tiles (all D);
//   FERRY_ATTN_FWD_QREGS=1  32 rows per warp, Q in registers (the previous default; D = 128: 32-key
//                           tiles, 255 registers and 76 bytes spilled on sm_90);
//   neither (default)       32 rows per warp; D = 128 re-reads Q from shared memory (32-key tiles,
//                           248 registers, no spill; 64-key tiles would spill 72 bytes); D = 16,
//                           32, 64 as FERRY_ATTN_FWD_QREGS=1 (no spill there).
enum class FwdVariant { kRows16, kRows32QRegs, kRows32 };
FwdVariant fwd_variant() {
  const char* mt = std::getenv("FERRY_ATTN_FWD_MT");
  if (mt != nullptr && mt[0] == '1') return FwdVariant::kRows16;
  const char* qr = std::getenv("FERRY_ATTN_FWD_QREGS");
  if (qr != nullptr && qr[0] == '1') return FwdVariant::kRows32QRegs;
  return FwdVariant::kRows32;
}

// Whether the warpgroup-MMA forward may run: not turned off (FERRY_ATTN_FWD_WGMMA=0) and none of
// the mma.sync variants' switches set (so each of them stays reachable and tested).
bool fwd_wgmma_requested() {
  const char* w = std::getenv("FERRY_ATTN_FWD_WGMMA");
  if (w != nullptr && std::string_view(w) == "0") return false;
  return std::getenv("FERRY_ATTN_FWD_MT") == nullptr &&
         std::getenv("FERRY_ATTN_FWD_QREGS") == nullptr &&
         std::getenv("FERRY_ATTN_FWD_LAZY") == nullptr;
}

// The variant's D dispatch, with or without the lazy rescale.
template <bool kLazy, bool kWide = false>
cudaError_t launch_fwd(FwdVariant var, void* out, float* lse, const void* q, const void* k,
                       const void* v, const std::int32_t* cu, AttnShape sh, cudaStream_t stream) {
  const bool two = var != FwdVariant::kRows16;
  switch (sh.d) {
    // D = 16 / 32: small models (the tiny Hugging Face fixtures of tests/gpu/model_gpu_test.cpp).
    case 16:
      return two ? launch_fwd_d<16, 2, 64, true, kLazy>(out, lse, q, k, v, cu, sh, stream)
                 : launch_fwd_d<16, 1, 64, true, kLazy>(out, lse, q, k, v, cu, sh, stream);
    case 32:
      return two ? launch_fwd_d<32, 2, 64, true, kLazy>(out, lse, q, k, v, cu, sh, stream)
                 : launch_fwd_d<32, 1, 64, true, kLazy>(out, lse, q, k, v, cu, sh, stream);
    case 64:
      return two ? launch_fwd_d<64, 2, 64, true, kLazy>(out, lse, q, k, v, cu, sh, stream)
                 : launch_fwd_d<64, 1, 64, true, kLazy>(out, lse, q, k, v, cu, sh, stream);
    case 128:
      switch (var) {
        case FwdVariant::kRows16:
          return launch_fwd_d<128, 1, 64, true, kLazy>(out, lse, q, k, v, cu, sh, stream);
        case FwdVariant::kRows32QRegs:
          return launch_fwd_d<128, 2, 32, true, kLazy>(out, lse, q, k, v, cu, sh, stream);
        case FwdVariant::kRows32:
          // kWide: 64-key tiles (with kLazy, 255 registers and no spill on sm_90 ptxas 13.0;
          // without it they spill 72 bytes, hence 32 keys by default).
          if constexpr (kWide) {
            return launch_fwd_d<128, 2, 64, false, kLazy>(out, lse, q, k, v, cu, sh, stream);
          } else {
            return launch_fwd_d<128, 2, 32, false, kLazy>(out, lse, q, k, v, cu, sh, stream);
          }
      }
      return cudaErrorInvalidValue;
    default:
      return cudaErrorInvalidValue;  // the backend reports unimplemented before getting here
  }
}

}  // namespace

cudaError_t launch_attention_fwd(void* out, float* lse, const void* q, const void* k, const void* v,
                                 const std::int32_t* cu_seqlens, AttnShape sh,
                                 cudaStream_t stream) {
  if (sh.t == 0) return cudaSuccess;
  // The warpgroup-MMA forward (attention_fwd_wgmma.cu): the default at D = 64 / 128 where it can
  // run, unless FERRY_ATTN_FWD_WGMMA=0 or another variant below is asked for by name.
  if ((sh.d == 64 || sh.d == 128) && fwd_wgmma_requested() && wgmma_available())
    return launch_fwd_wgmma(out, lse, q, k, v, cu_seqlens, sh, stream);
  const FwdVariant var = fwd_variant();
  // The conditional rescale (attention_fwd_kernel's kLazy) is the default since session 27, with
  // 64-key tiles for the D = 128 variant of 32 rows per warp (Q from shared memory), which the
  // lazy rescale's lower register count lets fit: on the H200 the forward of S 2048 x B 4, 16/2
  // heads took 0.326 ms against 0.502 ms before (docs/cuda.md). FERRY_ATTN_FWD_LAZY=0: the eager
  // rescale with 32-key tiles (the previous default); =1: lazy with 32-key tiles.
  const char* lazy = std::getenv("FERRY_ATTN_FWD_LAZY");
  const std::string_view mode = lazy != nullptr ? std::string_view(lazy) : std::string_view("64");
  if (mode == "0") return launch_fwd<false>(var, out, lse, q, k, v, cu_seqlens, sh, stream);
  if (mode == "1") return launch_fwd<true>(var, out, lse, q, k, v, cu_seqlens, sh, stream);
  return launch_fwd<true, true>(var, out, lse, q, k, v, cu_seqlens, sh, stream);
}

}  // namespace ferry::kernels::cuda
