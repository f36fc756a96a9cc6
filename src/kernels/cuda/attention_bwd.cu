// SPDX-License-Identifier: Apache-2.0
// Flash-style attention backward (FlashAttention-2 algorithm, our own code), deterministic: no
// atomics. Three kernels on one stream:
//   1. dsum[t, h] = rowsum(dO * O) (f32), stashed in the first 4 bytes of d_q's own row (t, h):
//      d_q is overwritten later anyway and AttentionBackwardArgs carries no workspace.
//   2. dK, dV: one CTA per 64 keys of a kv head; loops over the H/G query heads of its group and
//      over query tiles, recomputing P^T = exp(S^T - lse) from K Q^T, so dK and dV are written
//      once.
//   3. dQ: one CTA per 64 query rows of a head; loops over key tiles; reads its rows' dsum before
//      overwriting them with dQ.
// Each kernel computes its products with mma.sync m16n8k16 and reuses C fragments as A fragments
// (attention_common.cuh). Tested in tests/gpu/kernels_attention_test.cpp.
#include "kernels/cuda/attention_common.cuh"

namespace ferry::kernels::cuda {
namespace {

using namespace attn;

constexpr int kBK = 64;  // keys per CTA (dK/dV) and query rows per CTA (dQ)

__device__ __forceinline__ float* dsum_slot(bf16* d_q, std::int64_t tok, std::int64_t h,
                                            std::int64_t heads, int d) {
  return reinterpret_cast<float*>(d_q + (tok * heads + h) * d);
}

template <int D>
__global__ void attention_bwd_dsum_kernel(bf16* __restrict__ d_q, const bf16* __restrict__ d_out,
                                          const bf16* __restrict__ out, std::int64_t rows,
                                          std::int64_t heads) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  float acc = 0.0f;
  for (int i = lane; i < D; i += 32)
    acc = fmaf(__bfloat162float(d_out[row * D + i]), __bfloat162float(out[row * D + i]), acc);
  acc = warp_sum(acc);
  if (lane == 0) dsum_slot(d_q, row / heads, row % heads, heads, D)[0] = acc;
}

template <int D, int BQ>
__global__ void __launch_bounds__(kThreads)
    attention_bwd_dkdv_kernel(bf16* __restrict__ d_k, bf16* __restrict__ d_v,
                              bf16* __restrict__ d_q_scratch, const bf16* __restrict__ d_out,
                              const bf16* __restrict__ q, const bf16* __restrict__ k,
                              const bf16* __restrict__ v, const float* __restrict__ lse,
                              const std::int32_t* __restrict__ cu, AttnShape sh, float scale_log2) {
  constexpr int kStr = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* vs = ks + kBK * kStr;
  bf16* qs = vs + kBK * kStr;
  bf16* dos = qs + BQ * kStr;
  float* lse2_s = reinterpret_cast<float*>(dos + BQ * kStr);
  float* dsum_s = lse2_s + BQ;

  SeqBlock sb;
  if (!find_block(cu, sh.s, kBK, blockIdx.x, &sb)) return;
  const std::int64_t kvh = blockIdx.y;
  const std::int64_t group = sh.h / sh.g;
  const std::int64_t s0 = sb.start, len = sb.len, k0 = sb.block * kBK;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const std::int64_t kr[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};

  load_rows<D>(ks, k, s0, k0, len, kBK, sh.g, kvh);
  load_rows<D>(vs, v, s0, k0, len, kBK, sh.g, kvh);

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
    dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
  }

  for (std::int64_t hh = 0; hh < group; ++hh) {
    const std::int64_t h = kvh * group + hh;
    const std::int64_t qstart = sh.causal ? (k0 / BQ) * BQ : 0;
    for (std::int64_t q0 = qstart; q0 < len; q0 += BQ) {
      __syncthreads();
      load_rows<D>(qs, q, s0, q0, len, BQ, sh.h, h);
      load_rows<D>(dos, d_out, s0, q0, len, BQ, sh.h, h);
      for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
        const bool valid = q0 + i < len;
        lse2_s[i] = valid ? lse[h * sh.t + s0 + q0 + i] * kLog2e : 0.0f;
        dsum_s[i] = valid ? dsum_slot(d_q_scratch, s0 + q0 + i, h, sh.h, D)[0] : 0.0f;
      }
      __syncthreads();

      // S^T = K Q^T for this warp's 16 keys x BQ queries; then P^T in place.
      float st[BQ / 8][4];
      float dpt[BQ / 8][4];
#pragma unroll
      for (int i = 0; i < BQ / 8; ++i) {
        st[i][0] = st[i][1] = st[i][2] = st[i][3] = 0.0f;
        dpt[i][0] = dpt[i][1] = dpt[i][2] = dpt[i][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t ak[4], av[4];
        load_a(ak, ks, kStr, warp * 16, kk);
        load_a(av, vs, kStr, warp * 16, kk);
#pragma unroll
        for (int nt = 0; nt < BQ / 8; ++nt) {
          const bf16* pq = qs + (nt * 8 + g) * kStr + kk * 16 + 2 * t;
          mma_bf16(st[nt], ak, lds32(pq), lds32(pq + 8));
          const bf16* pd = dos + (nt * 8 + g) * kStr + kk * 16 + 2 * t;
          mma_bf16(dpt[nt], av, lds32(pd), lds32(pd + 8));
        }
      }
#pragma unroll
      for (int nt = 0; nt < BQ / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ql = nt * 8 + 2 * t + (e & 1);
          const std::int64_t qi = q0 + ql;
          const bool ok = qi < len && kr[e >> 1] < len && (!sh.causal || qi >= kr[e >> 1]);
          const float p = ok ? exp2f(st[nt][e] * scale_log2 - lse2_s[ql]) : 0.0f;
          st[nt][e] = p;
          dpt[nt][e] = p * (dpt[nt][e] - dsum_s[ql]);  // dS^T
        }
      }
      // dV += P^T dO ; dK += dS^T Q  (k dimension = queries)
#pragma unroll
      for (int kc = 0; kc < BQ / 16; ++kc) {
        std::uint32_t ap[4], ads[4];
        c_to_a(ap, st[2 * kc], st[2 * kc + 1]);
        c_to_a(ads, dpt[2 * kc], dpt[2 * kc + 1]);
#pragma unroll
        for (int nd = 0; nd < D / 8; ++nd) {
          std::uint32_t b0, b1;
          ldmatrix_b_trans(b0, b1, dos + kc * 16 * kStr + nd * 8, kStr);
          mma_bf16(dv[nd], ap, b0, b1);
          ldmatrix_b_trans(b0, b1, qs + kc * 16 * kStr + nd * 8, kStr);
          mma_bf16(dk[nd], ads, b0, b1);
        }
      }
    }
  }

  const float scale = sh.scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (kr[r] >= len) continue;
    bf16* dkp = d_k + ((s0 + kr[r]) * sh.g + kvh) * D + 2 * t;
    bf16* dvp = d_v + ((s0 + kr[r]) * sh.g + kvh) * D + 2 * t;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      *reinterpret_cast<std::uint32_t*>(dkp + nd * 8) =
          pack_bf16(dk[nd][2 * r] * scale, dk[nd][2 * r + 1] * scale);
      *reinterpret_cast<std::uint32_t*>(dvp + nd * 8) = pack_bf16(dv[nd][2 * r], dv[nd][2 * r + 1]);
    }
  }
}

template <int D, int BN>
__global__ void __launch_bounds__(kThreads)
    attention_bwd_dq_kernel(bf16* __restrict__ d_q, const bf16* __restrict__ d_out,
                            const bf16* __restrict__ q, const bf16* __restrict__ k,
                            const bf16* __restrict__ v, const float* __restrict__ lse,
                            const std::int32_t* __restrict__ cu, AttnShape sh, float scale_log2) {
  constexpr int kStr = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* dos = qs + kBK * kStr;
  bf16* ks = dos + kBK * kStr;
  bf16* vs = ks + BN * kStr;

  SeqBlock sb;
  if (!find_block(cu, sh.s, kBK, blockIdx.x, &sb)) return;
  const std::int64_t h = blockIdx.y;
  const std::int64_t kvh = h / (sh.h / sh.g);
  const std::int64_t s0 = sb.start, len = sb.len, q0 = sb.block * kBK;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const std::int64_t qi[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};

  load_rows<D>(qs, q, s0, q0, len, kBK, sh.h, h);
  load_rows<D>(dos, d_out, s0, q0, len, kBK, sh.h, h);
  float lse2[2], dsum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = qi[r] < len;
    lse2[r] = valid ? lse[h * sh.t + s0 + qi[r]] * kLog2e : 0.0f;
    dsum[r] = valid ? dsum_slot(d_q, s0 + qi[r], h, sh.h, D)[0] : 0.0f;
  }
  __syncthreads();  // every dsum read happens before any d_q write below

  float dq[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;

  const std::int64_t kend = sh.causal ? min(len, q0 + kBK) : len;
  for (std::int64_t k0 = 0; k0 < kend; k0 += BN) {
    __syncthreads();
    load_rows<D>(ks, k, s0, k0, len, BN, sh.g, kvh);
    load_rows<D>(vs, v, s0, k0, len, BN, sh.g, kvh);
    __syncthreads();
    float s[BN / 8][4], dp[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
      dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t aq[4], ad[4];
      load_a(aq, qs, kStr, warp * 16, kk);
      load_a(ad, dos, kStr, warp * 16, kk);
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        const bf16* pk = ks + (nt * 8 + g) * kStr + kk * 16 + 2 * t;
        mma_bf16(s[nt], aq, lds32(pk), lds32(pk + 8));
        const bf16* pv = vs + (nt * 8 + g) * kStr + kk * 16 + 2 * t;
        mma_bf16(dp[nt], ad, lds32(pv), lds32(pv + 8));
      }
    }
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const std::int64_t kj = k0 + nt * 8 + 2 * t + (e & 1);
        const bool ok = qi[r] < len && kj < len && (!sh.causal || kj <= qi[r]);
        const float p = ok ? exp2f(s[nt][e] * scale_log2 - lse2[r]) : 0.0f;
        dp[nt][e] = p * (dp[nt][e] - dsum[r]);  // dS
      }
    }
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
      std::uint32_t a[4];
      c_to_a(a, dp[2 * kc], dp[2 * kc + 1]);
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        std::uint32_t b0, b1;
        ldmatrix_b_trans(b0, b1, ks + kc * 16 * kStr + nd * 8, kStr);
        mma_bf16(dq[nd], a, b0, b1);
      }
    }
  }

  const float scale = sh.scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (qi[r] >= len) continue;
    bf16* dst = d_q + ((s0 + qi[r]) * sh.h + h) * D + 2 * t;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd)
      *reinterpret_cast<std::uint32_t*>(dst + nd * 8) =
          pack_bf16(dq[nd][2 * r] * scale, dq[nd][2 * r + 1] * scale);
  }
}

template <int D, int BQ, int BN>
cudaError_t launch_bwd_d(void* d_q, void* d_k, void* d_v, const void* d_out, const void* q,
                         const void* k, const void* v, const void* out, const float* lse,
                         const std::int32_t* cu, AttnShape sh, cudaStream_t stream) {
  constexpr int kStr = D + 8;
  const float scale_log2 = sh.scale * kLog2e;
  auto* dq = static_cast<bf16*>(d_q);
  const auto* dout = static_cast<const bf16*>(d_out);
  const auto* qq = static_cast<const bf16*>(q);
  const auto* kk = static_cast<const bf16*>(k);
  const auto* vv = static_cast<const bf16*>(v);

  const std::int64_t rows = sh.t * sh.h;
  attention_bwd_dsum_kernel<D><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(
      dq, dout, static_cast<const bf16*>(out), rows, sh.h);

  const int smem_kv = (2 * kBK + 2 * BQ) * kStr * static_cast<int>(sizeof(bf16)) +
                      2 * BQ * static_cast<int>(sizeof(float));
  cudaError_t err = cudaFuncSetAttribute(attention_bwd_dkdv_kernel<D, BQ>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem_kv);
  if (err != cudaSuccess) return err;
  attention_bwd_dkdv_kernel<D, BQ>
      <<<dim3(grid_blocks(sh.t, sh.s, kBK), static_cast<unsigned>(sh.g)), kThreads, smem_kv,
         stream>>>(static_cast<bf16*>(d_k), static_cast<bf16*>(d_v), dq, dout, qq, kk, vv, lse, cu,
                   sh, scale_log2);

  const int smem_q = (2 * kBK + 2 * BN) * kStr * static_cast<int>(sizeof(bf16));
  err = cudaFuncSetAttribute(attention_bwd_dq_kernel<D, BN>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem_q);
  if (err != cudaSuccess) return err;
  attention_bwd_dq_kernel<D, BN>
      <<<dim3(grid_blocks(sh.t, sh.s, kBK), static_cast<unsigned>(sh.h)), kThreads, smem_q,
         stream>>>(dq, dout, qq, kk, vv, lse, cu, sh, scale_log2);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_attention_bwd(void* d_q, void* d_k, void* d_v, const void* d_out, const void* q,
                                 const void* k, const void* v, const void* out, const float* lse,
                                 const std::int32_t* cu_seqlens, AttnShape sh,
                                 cudaStream_t stream) {
  if (sh.t == 0) return cudaSuccess;
  switch (sh.d) {
    case 64:
      return launch_bwd_d<64, 64, 64>(d_q, d_k, d_v, d_out, q, k, v, out, lse, cu_seqlens, sh,
                                      stream);
    case 128:
      return launch_bwd_d<128, 32, 32>(d_q, d_k, d_v, d_out, q, k, v, out, lse, cu_seqlens, sh,
                                       stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace ferry::kernels::cuda
