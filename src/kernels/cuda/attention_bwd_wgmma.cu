// SPDX-License-Identifier: Apache-2.0
// The attention backward's dK/dV and dQ kernels with sm_90a warpgroup MMAs (D = 64 / 128, sm_90a
// builds on a compute capability 9.0 device: the default there; FERRY_ATTN_BWD_WGMMA=0 turns them
// off; attention_bwd.cu launches them in place of attention_bwd_dkdv_kernel and
// attention_bwd_dq_kernel on the deterministic path).
//
// Why: the mma.sync kernel reads ~320 bytes of shared memory per tensor-core MMA (its K / V
// A fragments per item, its Q / dO B fragments twice, through ldmatrix into registers) and is
// bound by shared-memory bandwidth (docs/cuda.md, "Why the mma.sync attention kernels trail
// flash"). A warpgroup MMA reads its shared-memory operands in the tensor cores' own path, 64 rows
// at a time, without passing them through the warps' registers.
//
// Same work split as attention_bwd_dkdv_kernel: a CTA (one warpgroup, 4 warps) owns 64 keys of a
// kv head and one slice of its query heads, warp w keys 16w .. 16w + 15 (the wgmma accumulator
// rows of warp w: wgmma.cuh), and loops over (head, 64-query tile) items, double-buffered by
// cp.async into 128-byte-swizzled tiles. Per item:
//   S^T  = K Q^T    m64 n64 over D / 16 k steps, A = K tile, B = Q tile (both K-major, smem)
//   dP^T = V dO^T   the same with V and dO
//   P^T, dS^T in registers (the mma.sync kernel's mask and rounding, the same expressions)
//   dV  += P^T dO   m64 nD over 4 k steps, A = P^T from registers, B = dO tile MN-major
//   dK  += dS^T Q   the same with dS^T and Q
// Fixed order, no atomics: deterministic. The tensor cores may group the sums differently from
// the mma.sync kernels, so the bits need not match theirs; both are held to the same tolerance
// rule (tests/gpu/kernels_attention_test.cpp). Also here: wgmma_available() (attention_wgmma.cuh),
// shared with the forward.
#include <atomic>
#include <cstdint>

#include "kernels/cuda/attention_bwd_common.cuh"
#include "kernels/cuda/attention_wgmma.cuh"

namespace ferry::kernels::cuda::attn {
namespace {

constexpr int kKeys = 64;   // keys per CTA (one warpgroup, 16 per warp)
constexpr int kTileQ = 64;  // queries per work item

template <int D>
struct Smem {
  static constexpr int kKvBytes = kKeys * D * 2;                 // one swizzled K or V tile
  static constexpr int kQBytes = kTileQ * D * 2;                 // one swizzled Q or dO tile
  static constexpr int kTiles = 2 * kKvBytes + 4 * kQBytes;      // K, V, 2 x Q, 2 x dO
  static constexpr int kBytes = kTiles + 4 * kTileQ * 4 + 1024;  // + lse, dsum x 2; alignment slack
};

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_bwd_dkdv_wgmma_kernel(bf16* __restrict__ d_k, bf16* __restrict__ d_v,
                                    float* __restrict__ partial, int slices, DsumRef dsum,
                                    const bf16* __restrict__ d_out, const bf16* __restrict__ q,
                                    const bf16* __restrict__ k, const bf16* __restrict__ v,
                                    const float* __restrict__ lse,
                                    const std::int32_t* __restrict__ cu, AttnShape sh,
                                    float scale_log2) {
#if FERRY_WGMMA_ENABLED
  using S = Smem<D>;
  constexpr int BQ = kTileQ;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Swizzle atoms need 1024-byte alignment of every tile (all tile sizes are multiples of 1024).
  unsigned char* const base = align1024(smem_raw);
  unsigned char* const ks = base;
  unsigned char* const vs = ks + S::kKvBytes;
  unsigned char* const qbuf = vs + S::kKvBytes;  // buffer b at qbuf + b * kQBytes
  unsigned char* const dobuf = qbuf + 2 * S::kQBytes;
  float* const lsebuf = reinterpret_cast<float*>(dobuf + 2 * S::kQBytes);  // [2][BQ]
  float* const dsumbuf = lsebuf + 2 * BQ;                                  // [2][BQ]

  SeqBlock sb;
  if (!find_block(cu, sh.s, kKeys, blockIdx.x, &sb)) return;
  const std::int64_t kvh = blockIdx.y / slices;
  const int slice = static_cast<int>(blockIdx.y % slices);
  const std::int64_t group = sh.h / sh.g;
  const std::int64_t per_slice = group / slices;
  const std::int64_t h_begin = kvh * group + slice * per_slice;
  const std::int64_t s0 = sb.start, len = sb.len, k0 = sb.block * kKeys;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t kr[2] = {k0 + warp * 16 + (lane >> 2), k0 + warp * 16 + (lane >> 2) + 8};

  const std::int64_t qstart = sh.causal ? (k0 / BQ) * BQ : 0;
  const std::int64_t qtiles = len > qstart ? (len - qstart + BQ - 1) / BQ : 0;
  const std::int64_t items = per_slice * qtiles;
  auto issue = [&](std::int64_t item, int buf) {
    const std::int64_t h = h_begin + item / qtiles, q0 = qstart + (item % qtiles) * BQ;
    load_rows_swz<D>(qbuf + buf * S::kQBytes, q, s0, q0, len, BQ, sh.h, h);
    load_rows_swz<D>(dobuf + buf * S::kQBytes, d_out, s0, q0, len, BQ, sh.h, h);
    for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
      const bool valid = q0 + i < len;
      cp_async4(lsebuf + buf * BQ + i, valid ? lse + h * sh.t + s0 + q0 + i : lse, valid);
      cp_async4(dsumbuf + buf * BQ + i, valid ? dsum.at(s0 + q0 + i, h) : lse, valid);
    }
  };

  load_rows_swz<D>(ks, k, s0, k0, len, kKeys, sh.g, kvh);
  load_rows_swz<D>(vs, v, s0, k0, len, kKeys, sh.g, kvh);
  if (items > 0) issue(0, 0);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
    dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
  }
  auto& dk_f = *reinterpret_cast<float(*)[D / 2]>(&dk[0][0]);
  auto& dv_f = *reinterpret_cast<float(*)[D / 2]>(&dv[0][0]);

  for (std::int64_t it = 0; it < items; ++it) {
    cp_async_wait_all();
    // This thread's cp.async writes are generic-proxy writes; the tensor cores read through the
    // async proxy. Fence, then the barrier publishes every thread's.
    wgmma::fence_proxy_async();
    // Item `it` (and K, V) landed for all; every warpgroup MMA of item it - 1 has completed (its
    // wait below), so buffer (it + 1) & 1 is free.
    __syncthreads();
    if (it + 1 < items) issue(it + 1, static_cast<int>((it + 1) & 1));
    cp_async_commit();
    const int buf = static_cast<int>(it & 1);
    const unsigned char* qs = qbuf + buf * S::kQBytes;
    const unsigned char* dos = dobuf + buf * S::kQBytes;
    const float* lse_s = lsebuf + buf * BQ;
    const float* dsum_s = dsumbuf + buf * BQ;
    const std::int64_t q0 = qstart + (it % qtiles) * BQ;

    // S^T = K Q^T and dP^T = V dO^T (64 keys x 64 queries each), accumulators overwritten at kk 0.
    float st[BQ / 8][4], dpt[BQ / 8][4];
    auto& st_f = *reinterpret_cast<float(*)[BQ / 2]>(&st[0][0]);
    auto& dpt_f = *reinterpret_cast<float(*)[BQ / 2]>(&dpt[0][0]);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma::mma_ss_m64n64k16(st_f, wgmma::desc_kmajor(ks, kKeys, 0, kk),
                              wgmma::desc_kmajor(qs, BQ, 0, kk), kk > 0);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma::mma_ss_m64n64k16(dpt_f, wgmma::desc_kmajor(vs, kKeys, 0, kk),
                              wgmma::desc_kmajor(dos, BQ, 0, kk), kk > 0);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(st_f);
    wgmma::fence_operands(dpt_f);

    // P^T and dS^T: attention_bwd_dkdv_kernel's (the same helper).
    p_and_ds<BQ>(st, dpt, lse_s, dsum_s, q0, k0 + warp * 16, kr, len, sh.causal, scale_log2);

    // dV += P^T dO, dK += dS^T Q (k = queries, 16 per step; B tiles read MN-major).
    std::uint32_t ap[BQ / 16][4], ads[BQ / 16][4];
#pragma unroll
    for (int kc = 0; kc < BQ / 16; ++kc) {
      c_to_a(ap[kc], st[2 * kc], st[2 * kc + 1]);
      c_to_a(ads[kc], dpt[2 * kc], dpt[2 * kc + 1]);
    }
    wgmma::fence();
#pragma unroll
    for (int kc = 0; kc < BQ / 16; ++kc) {
      wgmma::mma_rs_bmn<D>(dv_f, ap[kc], wgmma::desc_mnmajor(dos, BQ, kc * 16));
    }
#pragma unroll
    for (int kc = 0; kc < BQ / 16; ++kc) {
      wgmma::mma_rs_bmn<D>(dk_f, ads[kc], wgmma::desc_mnmajor(qs, BQ, kc * 16));
    }
    wgmma::commit();
    // Done reading this item's tiles and the A registers before the next item reuses either.
    wgmma::wait<0>();
    wgmma::fence_operands(dv_f);
    wgmma::fence_operands(dk_f);
  }
  cp_async_wait_all();  // nothing may be in flight into smem when the CTA exits
  store_dkdv<D>(dk, dv, kr, s0, len, kvh, slice, slices, partial, d_k, d_v, sh);
#else
  (void)d_k, (void)d_v, (void)partial, (void)slices, (void)dsum, (void)d_out, (void)q, (void)k,
      (void)v, (void)lse, (void)cu, (void)sh, (void)scale_log2;
  __trap();  // never launched: wgmma_available() is false without sm_90a
#endif
}

// dQ with warpgroup MMAs: attention_bwd_dq_kernel's work split (a CTA of 4 warps owns 64 query
// rows of one head, warp w rows 16w .. 16w + 15; causal: heavy blocks first) and arithmetic
// (the same dS expression), over 64-key tiles double-buffered into swizzled tiles. Per tile:
//   S  = Q K^T    m64 n64, A = Q tile, B = K tile (K-major)
//   dP = dO V^T   the same with dO and V
//   dS = P (dP - dsum) in registers
//   dQ += dS K    m64 nD, A = dS from registers, B = K tile MN-major
// dsum is read from d_q's own rows (DsumRef) before this CTA writes them; deterministic.
template <int D>
struct DqSmem {
  static constexpr int kTileBytes = 64 * D * 2;
  static constexpr int kBytes = 6 * kTileBytes + 1024;  // Q, dO, 2 x K, 2 x V; alignment slack
};

template <int D>
__global__ void __launch_bounds__(kThreads)
    attention_bwd_dq_wgmma_kernel(bf16* __restrict__ d_q, DsumRef dsum,
                                  const bf16* __restrict__ d_out, const bf16* __restrict__ q,
                                  const bf16* __restrict__ k, const bf16* __restrict__ v,
                                  const float* __restrict__ lse,
                                  const std::int32_t* __restrict__ cu, AttnShape sh,
                                  float scale_log2) {
#if FERRY_WGMMA_ENABLED
  constexpr int BM = 64, BN = 64;
  constexpr int kTile = DqSmem<D>::kTileBytes;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* const base = align1024(smem_raw);
  unsigned char* const qs = base;
  unsigned char* const dos = qs + kTile;
  unsigned char* const kbuf = dos + kTile;  // buffer b at kbuf + b * kTile
  unsigned char* const vbuf = kbuf + 2 * kTile;

  SeqBlock sb;
  if (!find_block(cu, sh.s, BM, blockIdx.x, &sb)) return;
  if (sh.causal) sb.block = sb.blocks - 1 - sb.block;  // heavy blocks first
  const std::int64_t h = blockIdx.y;
  const std::int64_t kvh = h / (sh.h / sh.g);
  const std::int64_t s0 = sb.start, len = sb.len, q0 = sb.block * BM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const std::int64_t qi[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};

  const std::int64_t kend = sh.causal ? min(len, q0 + BM) : len;
  const std::int64_t tiles = (kend + BN - 1) / BN;
  load_rows_swz<D>(qs, q, s0, q0, len, BM, sh.h, h);
  load_rows_swz<D>(dos, d_out, s0, q0, len, BM, sh.h, h);
  if (tiles > 0) {
    load_rows_swz<D>(kbuf, k, s0, 0, len, BN, sh.g, kvh);
    load_rows_swz<D>(vbuf, v, s0, 0, len, BN, sh.g, kvh);
  }
  cp_async_commit();
  float lse2[2], dsr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = qi[r] < len;
    lse2[r] = valid ? lse[h * sh.t + s0 + qi[r]] * kLog2e : 0.0f;
    dsr[r] = valid ? *dsum.at(s0 + qi[r], h) : 0.0f;
  }
  // Every dsum read above happens before any d_q write at the end: the barrier in the first
  // iteration (or none at all when there are no tiles, and then this CTA's rows stay zero).

  float dq[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
  auto& dq_f = *reinterpret_cast<float(*)[D / 2]>(&dq[0][0]);

  for (std::int64_t j = 0; j < tiles; ++j) {
    const std::int64_t k0 = j * BN;
    cp_async_wait_all();
    wgmma::fence_proxy_async();
    // Tile j (and Q, dO) landed for all; tile j - 1's warpgroup MMAs completed (waited below).
    __syncthreads();
    if (j + 1 < tiles) {
      load_rows_swz<D>(kbuf + ((j + 1) & 1) * kTile, k, s0, k0 + BN, len, BN, sh.g, kvh);
      load_rows_swz<D>(vbuf + ((j + 1) & 1) * kTile, v, s0, k0 + BN, len, BN, sh.g, kvh);
    }
    cp_async_commit();
    const unsigned char* ks = kbuf + (j & 1) * kTile;
    const unsigned char* vs = vbuf + (j & 1) * kTile;
    float s[BN / 8][4], dp[BN / 8][4];
    auto& s_f = *reinterpret_cast<float(*)[BN / 2]>(&s[0][0]);
    auto& dp_f = *reinterpret_cast<float(*)[BN / 2]>(&dp[0][0]);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma::mma_ss_m64n64k16(s_f, wgmma::desc_kmajor(qs, BM, 0, kk),
                              wgmma::desc_kmajor(ks, BN, 0, kk), kk > 0);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma::mma_ss_m64n64k16(dp_f, wgmma::desc_kmajor(dos, BM, 0, kk),
                              wgmma::desc_kmajor(vs, BN, 0, kk), kk > 0);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(s_f);
    wgmma::fence_operands(dp_f);
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const std::int64_t kj = k0 + nt * 8 + 2 * t + (e & 1);
        const bool ok = qi[r] < len && kj < len && (!sh.causal || kj <= qi[r]);
        const float p = ok ? fast_exp2(s[nt][e] * scale_log2 - lse2[r]) : 0.0f;
        dp[nt][e] = p * (dp[nt][e] - dsr[r]);  // dS
      }
    }
    std::uint32_t a[BN / 16][4];
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) c_to_a(a[kc], dp[2 * kc], dp[2 * kc + 1]);
    wgmma::fence();
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
      wgmma::mma_rs_bmn<D>(dq_f, a[kc], wgmma::desc_mnmajor(ks, BN, kc * 16));
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(dq_f);
  }
  cp_async_wait_all();
  // With no tiles the loop's barrier never ran: order every dsum read before the writes.
  if (tiles == 0) __syncthreads();

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
#else
  (void)d_q, (void)dsum, (void)d_out, (void)q, (void)k, (void)v, (void)lse, (void)cu, (void)sh,
      (void)scale_log2;
  __trap();  // never launched: wgmma_available() is false without sm_90a
#endif
}

template <int D>
cudaError_t launch_dq_d(bf16* d_q, DsumRef dsum, const bf16* d_out, const bf16* q, const bf16* k,
                        const bf16* v, const float* lse, const std::int32_t* cu, AttnShape sh,
                        float scale_log2, dim3 grid, cudaStream_t stream) {
  constexpr int kSmem = DqSmem<D>::kBytes;
  cudaError_t err = cudaFuncSetAttribute(attention_bwd_dq_wgmma_kernel<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  attention_bwd_dq_wgmma_kernel<D>
      <<<grid, kThreads, kSmem, stream>>>(d_q, dsum, d_out, q, k, v, lse, cu, sh, scale_log2);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_d(bf16* d_k, bf16* d_v, float* partial, int slices, DsumRef dsum,
                     const bf16* d_out, const bf16* q, const bf16* k, const bf16* v,
                     const float* lse, const std::int32_t* cu, AttnShape sh, float scale_log2,
                     dim3 grid, cudaStream_t stream) {
  constexpr int kSmem = Smem<D>::kBytes;
  cudaError_t err = cudaFuncSetAttribute(attention_bwd_dkdv_wgmma_kernel<D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  attention_bwd_dkdv_wgmma_kernel<D><<<grid, kThreads, kSmem, stream>>>(
      d_k, d_v, partial, slices, dsum, d_out, q, k, v, lse, cu, sh, scale_log2);
  return cudaGetLastError();
}

}  // namespace

bool wgmma_available() {
#if defined(FERRY_CUDA_SM90A)
  // Per device: 0 not yet asked, 1 no, 2 yes (compute capability 9.0 exactly: the only devices
  // that run sm_90a code). A race only repeats the query.
  static std::atomic<int> cached[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  int v = cached[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, minor = 0;
    const bool ok =
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
    v = ok && major == 9 && minor == 0 ? 2 : 1;
    cached[dev].store(v, std::memory_order_relaxed);
  }
  return v == 2;
#else
  return false;
#endif
}

cudaError_t launch_bwd_dkdv_wgmma(int d, bf16* d_k, bf16* d_v, float* partial, int slices,
                                  DsumRef dsum, const bf16* d_out, const bf16* q, const bf16* k,
                                  const bf16* v, const float* lse, const std::int32_t* cu,
                                  AttnShape sh, float scale_log2, dim3 grid, cudaStream_t stream) {
  switch (d) {
    case 64:
      return launch_d<64>(d_k, d_v, partial, slices, dsum, d_out, q, k, v, lse, cu, sh, scale_log2,
                          grid, stream);
    case 128:
      return launch_d<128>(d_k, d_v, partial, slices, dsum, d_out, q, k, v, lse, cu, sh, scale_log2,
                           grid, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launch_bwd_dq_wgmma(int d, bf16* d_q, DsumRef dsum, const bf16* d_out, const bf16* q,
                                const bf16* k, const bf16* v, const float* lse,
                                const std::int32_t* cu, AttnShape sh, float scale_log2, dim3 grid,
                                cudaStream_t stream) {
  switch (d) {
    case 64:
      return launch_dq_d<64>(d_q, dsum, d_out, q, k, v, lse, cu, sh, scale_log2, grid, stream);
    case 128:
      return launch_dq_d<128>(d_q, dsum, d_out, q, k, v, lse, cu, sh, scale_log2, grid, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace ferry::kernels::cuda::attn

namespace ferry::kernels::cuda {
bool attention_wgmma_available() { return attn::wgmma_available(); }
}  // namespace ferry::kernels::cuda
