// SPDX-License-Identifier: Apache-2.0
// Flash-style attention backward (FlashAttention-2 algorithm, our own code). Two paths.
//
// Deterministic (the default; no atomics). Three kernels on one stream:
//   1. dsum[t, h] = rowsum(dO * O) (f32), stashed in the first 4 bytes of d_q's own row (t, h):
//      d_q is overwritten later anyway (DsumRef below says where dsum lives).
//   2. dK, dV: one CTA per 64 keys of a kv head and per slice of its group's H/G query heads;
//      loops over those heads and over query tiles (double-buffered through cp.async),
//      recomputing P^T = exp(S^T - lse) from K Q^T. With one slice (no workspace) dK and dV are
//      written once, in bf16. With W slices (a caller-provided f32 workspace, W x [T, G, D] x 2)
//      each slice writes its partial sums and a fourth kernel adds the W partials in slice order:
//      W times the CTAs (a kv head's group no longer serialises on 4 warps), same determinism.
//      16 keys per warp over the whole D (attention_bwd_dkdv_kernel). (A 32-keys-per-warp
//      variant, 3-5 % slower and with racecheck reports nobody explained, was removed in
//      session 31; docs/cuda.md.)
//   3. dQ: one CTA per 64 query rows of a head; loops over key tiles (double-buffered); reads its
//      rows' dsum before overwriting them with dQ. Causal: heavy query blocks first.
// 7 tensor-core products per (key block, query tile): S^T, dP^T, dV, dK in kernel 2 and S, dP, dQ
// again in kernel 3.
//
// Atomic dQ (opt-in, FERRY_ATTN_BWD_DQ=atomic, D = 64 / 128, and only with a workspace of at
// least T H D + T H floats; otherwise the deterministic path runs): FlashAttention-2's 5 products.
//   1. the dsum kernel writes dsum to the workspace as [H, T] and zeroes the f32 dQ accumulator
//      [T, H, D] (also in the workspace);
//   2. attention_bwd_dkdv_kernel<D, BQ, kDq = true>: the 16-keys-per-warp dK/dV kernel, unchanged
//      (same slices, same MMAs in the same order: dK and dV have the deterministic path's bits),
//      plus per (head, query tile) item: each warp stores its dS^T (16 keys x BQ queries, bf16,
//      the very values its dK MMA uses) into a key-major [64][BQ + 8] shared tile; after a CTA
//      barrier each warp computes dQ_tile = dS K for all BQ queries and its D / 4 head dims over
//      the CTA's 64 keys — A = dS read from the key-major tile with ldmatrix.x4.trans (the
//      transpose comes free with the load), B = the resident K tile (ldmatrix.x4.trans pairs) —
//      and adds it into the accumulator with red.global.add.v4.f32 (lane pairs swap half their C
//      fragment with two shuffles so each lane holds 4 consecutive dims of one row). Per warp and
//      item that is as many MMAs as its dK product (BQ x D/4 x 64 vs 16 x D x BQ), so the
//      fragments and the accumulator (32 f32) stay small. The staging tile is written after the
//      item's top barrier (all reads of the previous item's tile happen before it) and read after
//      a second barrier that follows the dK/dV MMAs (every warp's stores are then visible);
//   3. (with W > 1 slices) the dK/dV partial reduction, as in the deterministic path;
//   4. d_q = bf16(scale * accumulator).
// dQ's f32 sums then depend on the order the CTAs' adds arrive in: not bitwise reproducible (the
// reason it is opt-in; docs/cuda.md "Determinism"). Workspace (attention_bwd_workspace_floats):
// [accumulator T H D | dsum H T, padded to 4 | dK/dV partials 2 T H D] floats; the partials'
// region sets the slices exactly as the whole workspace does on the deterministic path.
// The dQ step's fragment layouts and index math (and the workspace split) are replayed on a host
// warp emulator in tests/unit/kernels/warp_fragment_emulation_test.cpp, which pins the replayed
// expressions to this file's, attention_common.cuh's and attention_bwd_common.cuh's text:
// edit them together.
//
// Warpgroup MMAs (the default where it can run: D = 64 / 128, sm_90a builds on a compute
// capability 9.0 device, the deterministic path; FERRY_ATTN_BWD_WGMMA=0 turns it off): kernels 2
// and 3 are replaced by attention_bwd_wgmma.cu's, same grids, slices, partials and outputs.
//
// Each kernel here computes its products with mma.sync m16n8k16 and reuses C fragments as A
// fragments (attention_common.cuh). Tested in tests/gpu/kernels_attention_test.cpp.
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/attention_bwd_common.cuh"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_wgmma.cuh"

namespace ferry::kernels::cuda {
namespace {

using namespace attn;

constexpr int kBK = 64;  // keys per CTA (dK/dV) and query rows per CTA (dQ)

__device__ __forceinline__ float* dsum_slot(bf16* d_q, std::int64_t tok, std::int64_t h,
                                            std::int64_t heads, int d) {
  return reinterpret_cast<float*>(d_q + (tok * heads + h) * d);
}

// One warp per (token, head) row: dsum, and with dq_acc (atomic dQ) the row's f32 accumulator
// zeroed for the dK/dV/dQ kernel that follows on the stream.
template <int D>
__global__ void attention_bwd_dsum_kernel(DsumRef dsum, float* __restrict__ dq_acc,
                                          const bf16* __restrict__ d_out,
                                          const bf16* __restrict__ out, std::int64_t rows,
                                          std::int64_t heads) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  float acc = 0.0f;
  for (int i = lane; i < D; i += 32)
    acc = fmaf(__bfloat162float(d_out[row * D + i]), __bfloat162float(out[row * D + i]), acc);
  acc = warp_sum(acc);
  if (lane == 0) *dsum.at(row / heads, row % heads) = acc;
  if (dq_acc != nullptr) {
    float4* z = reinterpret_cast<float4*>(dq_acc + row * D);
    for (int i = lane; i < D / 4; i += 32) z[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// One work item of the dK/dV kernels' pipeline — query tile q0 of head h — into buffer `buf`:
// its Q and dO rows and its lse and dsum values (cp.async; the caller commits).
template <int D, int BQ>
__device__ __forceinline__ void issue_query_tile(std::int64_t h, std::int64_t q0, int buf,
                                                 bf16* qbuf, bf16* dobuf, float* lsebuf,
                                                 float* dsumbuf, const bf16* q, const bf16* d_out,
                                                 const float* lse, const DsumRef& dsum,
                                                 std::int64_t s0, std::int64_t len,
                                                 const AttnShape& sh) {
  constexpr int kTile = BQ * (D + 8);
  load_rows_async<D>(qbuf + buf * kTile, q, s0, q0, len, BQ, sh.h, h);
  load_rows_async<D>(dobuf + buf * kTile, d_out, s0, q0, len, BQ, sh.h, h);
  for (int i = threadIdx.x; i < BQ; i += blockDim.x) {
    const bool valid = q0 + i < len;
    cp_async4(lsebuf + buf * BQ + i, valid ? lse + h * sh.t + s0 + q0 + i : lse, valid);
    cp_async4(dsumbuf + buf * BQ + i, valid ? dsum.at(s0 + q0 + i, h) : lse, valid);
  }
}

// dQ_tile += dS K for one (head, query tile) item of the atomic-dQ dK/dV kernel (file comment):
// dss = the CTA's dS^T [kBK keys][BQ + 8] (bf16, complete: the caller's barrier), ks = the K tile
// [kBK][D + 8]. This warp: all BQ queries x head dims warp * D/4 .. + D/4 - 1, added into
// dq_acc [T, H, D] (f32) for the rows below len.
template <int D, int BQ>
__device__ __forceinline__ void dq_tile_atomic(float* __restrict__ dq_acc, const bf16* dss,
                                               const bf16* ks, std::int64_t h, std::int64_t q0,
                                               std::int64_t s0, std::int64_t len,
                                               const AttnShape& sh) {
  constexpr int kStr = D + 8;
  constexpr int kDsStr = BQ + 8;
  constexpr int kDW = D / 4;    // head dims per warp
  constexpr int kMT = BQ / 16;  // query m-tiles
  static_assert(kDW % 16 == 0 && BQ % 16 == 0, "dQ tile shape");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int dw0 = warp * kDW;
  float dq[kMT][kDW / 8][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int j = 0; j < kDW / 8; ++j)
      dq[mt][j][0] = dq[mt][j][1] = dq[mt][j][2] = dq[mt][j][3] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < kBK / 16; ++kc) {
    std::uint32_t bk[kDW / 16][4];
#pragma unroll
    for (int np = 0; np < kDW / 16; ++np)
      ldmatrix_b_trans_pair(bk[np], ks + kc * 16 * kStr + dw0 + np * 16, kStr);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      std::uint32_t a[4];
      ldmatrix_a_trans(a, dss, kDsStr, kc * 16, mt * 16);
#pragma unroll
      for (int np = 0; np < kDW / 16; ++np) {
        mma_bf16(dq[mt][2 * np], a, bk[np][0], bk[np][1]);
        mma_bf16(dq[mt][2 * np + 1], a, bk[np][2], bk[np][3]);
      }
    }
  }
  // C fragment: lane (g, t) holds rows g (c0, c1) and g + 8 (c2, c3) at dims 2t, 2t + 1. Lanes t
  // and t ^ 1 swap halves: even t keeps row g and gets its partner's (c0, c1) -> dims 2t .. 2t+3;
  // odd t keeps row g + 8 and gets its partner's (c2, c3) -> dims 2t - 2 .. 2t + 1. Every lane
  // shuffles (full mask); only the add is guarded.
  const bool odd = (t & 1) != 0;
  const int col = dw0 + 2 * (t & 2);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const std::int64_t row = q0 + mt * 16 + g + (odd ? 8 : 0);
    float* dst = dq_acc + ((s0 + row) * sh.h + h) * D + col;
#pragma unroll
    for (int j = 0; j < kDW / 8; ++j) {
      const float* c = dq[mt][j];
      const float r0 = __shfl_xor_sync(0xffffffffu, odd ? c[0] : c[2], 1);
      const float r1 = __shfl_xor_sync(0xffffffffu, odd ? c[1] : c[3], 1);
      if (row < len)
        red_add_f32x4(dst + j * 8, odd ? r0 : c[0], odd ? r1 : c[1], odd ? c[2] : r0,
                      odd ? c[3] : r1);
    }
  }
}

// Heads [h_begin, h_begin + heads) of kv head blockIdx.y / slices; slice = blockIdx.y % slices.
// partial == nullptr: bf16 dK (scaled) and dV straight out; else f32 partials for the reduction.
// kDq: also dQ into dq_acc by atomics (the file comment); dq_acc is unused otherwise.
template <int D, int BQ, bool kDq>
__global__ void __launch_bounds__(kThreads)
    attention_bwd_dkdv_kernel(bf16* __restrict__ d_k, bf16* __restrict__ d_v,
                              float* __restrict__ partial, int slices, float* __restrict__ dq_acc,
                              DsumRef dsum, const bf16* __restrict__ d_out,
                              const bf16* __restrict__ q, const bf16* __restrict__ k,
                              const bf16* __restrict__ v, const float* __restrict__ lse,
                              const std::int32_t* __restrict__ cu, AttnShape sh, float scale_log2) {
  constexpr int kStr = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* vs = ks + kBK * kStr;
  // Buffer b of Q is qbuf + b * kTile (pointer arithmetic: an indexed pointer array would live
  // in local memory); lse and dsum: lsebuf + b * BQ, dsumbuf + b * BQ.
  constexpr int kTile = BQ * kStr;
  bf16* const qbuf = vs + kBK * kStr;
  bf16* const dobuf = qbuf + 2 * kTile;
  float* const lsebuf = reinterpret_cast<float*>(dobuf + 2 * kTile);
  float* const dsumbuf = lsebuf + 2 * BQ;
  // kDq: the CTA's dS^T [kBK keys][kDsStr] (bf16), 16-byte rows (80 / 144 bytes): the 32-bit
  // stores (rows g, cols 2t) and the ldmatrix rows are both bank-conflict-free.
  constexpr int kDsStr = BQ + 8;
  bf16* const dss = reinterpret_cast<bf16*>(dsumbuf + 2 * BQ);

  SeqBlock sb;
  if (!find_block(cu, sh.s, kBK, blockIdx.x, &sb)) return;
  const std::int64_t kvh = blockIdx.y / slices;
  const int slice = static_cast<int>(blockIdx.y % slices);
  const std::int64_t group = sh.h / sh.g;
  const std::int64_t per_slice = group / slices;
  const std::int64_t h_begin = kvh * group + slice * per_slice;
  const std::int64_t s0 = sb.start, len = sb.len, k0 = sb.block * kBK;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const std::int64_t kr[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};

  // Work items: (head, query tile) pairs, flattened so one pipeline runs across heads.
  const std::int64_t qstart = sh.causal ? (k0 / BQ) * BQ : 0;
  const std::int64_t qtiles = len > qstart ? (len - qstart + BQ - 1) / BQ : 0;
  const std::int64_t items = per_slice * qtiles;
  auto issue = [&](std::int64_t item, int buf) {
    issue_query_tile<D, BQ>(h_begin + item / qtiles, qstart + (item % qtiles) * BQ, buf, qbuf,
                            dobuf, lsebuf, dsumbuf, q, d_out, lse, dsum, s0, len, sh);
  };

  load_rows_async<D>(ks, k, s0, k0, len, kBK, sh.g, kvh);
  load_rows_async<D>(vs, v, s0, k0, len, kBK, sh.g, kvh);
  if (items > 0) issue(0, 0);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
    dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
  }

  for (std::int64_t it = 0; it < items; ++it) {
    cp_async_wait_all();
    // Item `it` (and K, V) landed for all; all are done with item it - 1, including (kDq) their
    // dQ reads of dss, which this item overwrites below.
    __syncthreads();
    if (it + 1 < items) issue(it + 1, static_cast<int>((it + 1) & 1));
    cp_async_commit();
    const int buf = static_cast<int>(it & 1);
    const bf16* qs = qbuf + buf * kTile;
    const bf16* dos = dobuf + buf * kTile;
    const float* lse_s = lsebuf + buf * BQ;
    const float* dsum_s = dsumbuf + buf * BQ;
    const std::int64_t q0 = qstart + (it % qtiles) * BQ;

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
      for (int nt = 0; nt < BQ / 8; nt += 2) {
        std::uint32_t bq[4], bd[4];
        ldmatrix_b_pair(bq, qs, kStr, nt * 8, kk);
        ldmatrix_b_pair(bd, dos, kStr, nt * 8, kk);
        mma_bf16(st[nt], ak, bq[0], bq[1]);
        mma_bf16(st[nt + 1], ak, bq[2], bq[3]);
        mma_bf16(dpt[nt], av, bd[0], bd[1]);
        mma_bf16(dpt[nt + 1], av, bd[2], bd[3]);
      }
    }
    // P^T and dS^T (one rounding for every path: bwd_prob's explicit FMA).
    p_and_ds<BQ>(st, dpt, lse_s, dsum_s, q0, k0 + warp * 16, kr, len, sh.causal, scale_log2);
    if constexpr (kDq) {
      // This warp's dS^T rows (keys warp * 16 + g, + 8) in bf16: pack_bf16 of the same pairs
      // c_to_a packs for the dK MMA below, so dQ and dK see the same rounded dS.
#pragma unroll
      for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<std::uint32_t*>(dss + (warp * 16 + g + 8 * r) * kDsStr + nt * 8 +
                                            2 * t) = pack_bf16(dpt[nt][2 * r], dpt[nt][2 * r + 1]);
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
    if constexpr (kDq) {
      // Every warp's dS^T stores are visible after this barrier (the dK/dV MMAs above overlap
      // their latency). No warp writes dss again before the next item's top barrier, which every
      // warp reaches only after its dq_tile_atomic reads: no write-after-read hazard either.
      // Uniform: every warp runs every item (no per-warp skip in this kernel).
      __syncthreads();
      dq_tile_atomic<D, BQ>(dq_acc, dss, ks, h_begin + it / qtiles, q0, s0, len, sh);
    }
  }
  cp_async_wait_all();  // nothing may be in flight into smem when the CTA exits
  store_dkdv<D>(dk, dv, kr, s0, len, kvh, slice, slices, partial, d_k, d_v, sh);
}

// dK = scale * sum_w partial_k[w], dV = sum_w partial_v[w], slices added in order 0..W-1.
__global__ void attention_bwd_reduce_kernel(bf16* __restrict__ d_k, bf16* __restrict__ d_v,
                                            const float* __restrict__ partial, int slices,
                                            std::int64_t n, float scale) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* pv = partial + static_cast<std::int64_t>(slices) * n;
  float sk = 0.0f, sv = 0.0f;
  for (int w = 0; w < slices; ++w) {
    sk += partial[w * n + i];
    sv += pv[w * n + i];
  }
  d_k[i] = __float2bfloat16_rn(sk * scale);
  d_v[i] = __float2bfloat16_rn(sv);
}

// Atomic dQ's last step: d_q = bf16(scale * accumulator), 4 values per thread (n4 = T H D / 4).
__global__ void attention_bwd_dq_convert_kernel(bf16* __restrict__ d_q,
                                                const float* __restrict__ acc, std::int64_t n4,
                                                float scale) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  const float4 x = reinterpret_cast<const float4*>(acc)[i];
  reinterpret_cast<uint2*>(d_q)[i] =
      make_uint2(pack_bf16(x.x * scale, x.y * scale), pack_bf16(x.z * scale, x.w * scale));
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
  constexpr int kTile = BN * kStr;  // buffer b of K: kbuf + b * kTile (no local-memory array)
  bf16* const kbuf = dos + kBK * kStr;
  bf16* const vbuf = kbuf + 2 * kTile;

  SeqBlock sb;
  if (!find_block(cu, sh.s, kBK, blockIdx.x, &sb)) return;
  if (sh.causal) sb.block = sb.blocks - 1 - sb.block;  // heavy blocks first
  const std::int64_t h = blockIdx.y;
  const std::int64_t kvh = h / (sh.h / sh.g);
  const std::int64_t s0 = sb.start, len = sb.len, q0 = sb.block * kBK;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const std::int64_t qi[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};

  const std::int64_t kend = sh.causal ? min(len, q0 + kBK) : len;
  const std::int64_t tiles = (kend + BN - 1) / BN;
  load_rows_async<D>(qs, q, s0, q0, len, kBK, sh.h, h);
  load_rows_async<D>(dos, d_out, s0, q0, len, kBK, sh.h, h);
  if (tiles > 0) {
    load_rows_async<D>(kbuf, k, s0, 0, len, BN, sh.g, kvh);
    load_rows_async<D>(vbuf, v, s0, 0, len, BN, sh.g, kvh);
  }
  cp_async_commit();
  float lse2[2], dsum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = qi[r] < len;
    lse2[r] = valid ? lse[h * sh.t + s0 + qi[r]] * kLog2e : 0.0f;
    dsum[r] = valid ? dsum_slot(d_q, s0 + qi[r], h, sh.h, D)[0] : 0.0f;
  }
  cp_async_wait_all();
  __syncthreads();  // every dsum read happens before any d_q write below; Q, dO, tile 0 landed

  float dq[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;

  for (std::int64_t j = 0; j < tiles; ++j) {
    const std::int64_t k0 = j * BN;
    if (j > 0) {
      cp_async_wait_all();
      __syncthreads();
    }
    if (j + 1 < tiles) {
      load_rows_async<D>(kbuf + ((j + 1) & 1) * kTile, k, s0, k0 + BN, len, BN, sh.g, kvh);
      load_rows_async<D>(vbuf + ((j + 1) & 1) * kTile, v, s0, k0 + BN, len, BN, sh.g, kvh);
    }
    cp_async_commit();
    const bf16* ks = kbuf + (j & 1) * kTile;
    const bf16* vs = vbuf + (j & 1) * kTile;
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
      for (int nt = 0; nt < BN / 8; nt += 2) {
        std::uint32_t bk[4], bv[4];
        ldmatrix_b_pair(bk, ks, kStr, nt * 8, kk);
        ldmatrix_b_pair(bv, vs, kStr, nt * 8, kk);
        mma_bf16(s[nt], aq, bk[0], bk[1]);
        mma_bf16(s[nt + 1], aq, bk[2], bk[3]);
        mma_bf16(dp[nt], ad, bv[0], bv[1]);
        mma_bf16(dp[nt + 1], ad, bv[2], bv[3]);
      }
    }
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const std::int64_t kj = k0 + nt * 8 + 2 * t + (e & 1);
        const bool ok = qi[r] < len && kj < len && (!sh.causal || kj <= qi[r]);
        const float p = ok ? fast_exp2(s[nt][e] * scale_log2 - lse2[r]) : 0.0f;
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
  cp_async_wait_all();

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

// Floats of the atomic-dQ path's accumulator [T, H, D] plus dsum [H, T] (padded to 4 floats, so
// the partials that follow stay 16-byte aligned); the partials' region starts there.
std::int64_t atomic_dq_floats(std::int64_t t, std::int64_t h, std::int64_t d) {
  return t * h * d + (t * h + 3) / 4 * 4;
}

// BQ: query tile of the dK/dV kernel; BN: key tile of the dQ kernel. dq_atomic: the fused
// kernel with atomic dQ when D allows it and the workspace holds its accumulator (else the
// deterministic path).
template <int D, int BQ, int BN>
cudaError_t launch_bwd_d(void* d_q, void* d_k, void* d_v, const void* d_out, const void* q,
                         const void* k, const void* v, const void* out, const float* lse,
                         const std::int32_t* cu, AttnShape sh, float* workspace,
                         std::int64_t workspace_floats, bool dq_atomic, bool wgmma,
                         cudaStream_t stream) {
  constexpr int kStr = D + 8;
  const float scale_log2 = sh.scale * kLog2e;
  auto* dq = static_cast<bf16*>(d_q);
  const auto* dout = static_cast<const bf16*>(d_out);
  const auto* qq = static_cast<const bf16*>(q);
  const auto* kk = static_cast<const bf16*>(k);
  const auto* vv = static_cast<const bf16*>(v);

  const std::int64_t rows = sh.t * sh.h;
  constexpr bool kAtomicDims = D == 64 || D == 128;  // dQ step: D / 4 dims per warp, 16 | D / 4
  const std::int64_t acc_floats = atomic_dq_floats(sh.t, sh.h, D);
  const bool atomic =
      kAtomicDims && dq_atomic && workspace != nullptr && workspace_floats >= acc_floats;
  // Atomic: [accumulator | dsum [H, T] | partials]; deterministic: dsum in d_q, all partials.
  float* const dq_acc = atomic ? workspace : nullptr;
  const DsumRef dsum = atomic ? DsumRef{workspace + rows * D, 1, sh.t}
                              : DsumRef{reinterpret_cast<float*>(dq), sh.h * D / 2, D / 2};
  float* const part_ws = atomic ? workspace + acc_floats : workspace;
  const std::int64_t part_floats = atomic ? workspace_floats - acc_floats : workspace_floats;

  attention_bwd_dsum_kernel<D><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(
      dsum, dq_acc, dout, static_cast<const bf16*>(out), rows, sh.h);

  // Slices of each kv head's query-head group: as many as the partials' region holds (a divisor
  // of the group size), 1 without a workspace.
  const std::int64_t group = sh.h / sh.g;
  const std::int64_t per_slice_floats = 2 * sh.t * sh.g * D;
  int slices = 1;
  if (part_ws != nullptr) {
    for (std::int64_t w = group; w > 1; --w) {
      if (group % w == 0 && w * per_slice_floats <= part_floats) {
        slices = static_cast<int>(w);
        break;
      }
    }
  }
  float* partial = slices > 1 ? part_ws : nullptr;

  const dim3 grid_kv(grid_blocks(sh.t, sh.s, kBK), static_cast<unsigned>(sh.g * slices));
  const int smem_kv = (2 * kBK + 4 * BQ) * kStr * static_cast<int>(sizeof(bf16)) +
                      4 * BQ * static_cast<int>(sizeof(float));
  cudaError_t err = cudaSuccess;
  if constexpr (kAtomicDims) {
    if (atomic) {
      // + the dS^T staging tile [kBK][BQ + 8].
      const int smem_dq = smem_kv + kBK * (BQ + 8) * static_cast<int>(sizeof(bf16));
      err = cudaFuncSetAttribute(attention_bwd_dkdv_kernel<D, BQ, true>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, smem_dq);
      if (err != cudaSuccess) return err;
      attention_bwd_dkdv_kernel<D, BQ, true><<<grid_kv, kThreads, smem_dq, stream>>>(
          static_cast<bf16*>(d_k), static_cast<bf16*>(d_v), partial, slices, dq_acc, dsum, dout, qq,
          kk, vv, lse, cu, sh, scale_log2);
      if (partial != nullptr) {
        const std::int64_t n = sh.t * sh.g * D;
        attention_bwd_reduce_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
            static_cast<bf16*>(d_k), static_cast<bf16*>(d_v), partial, slices, n, sh.scale);
      }
      const std::int64_t n4 = rows * D / 4;
      attention_bwd_dq_convert_kernel<<<static_cast<unsigned>((n4 + 255) / 256), 256, 0, stream>>>(
          dq, dq_acc, n4, sh.scale);
      return cudaGetLastError();
    }
  }
  // The warpgroup-MMA kernels replace the dK/dV and the dQ kernel below (attention_bwd_wgmma.cu).
  const bool use_wgmma = (D == 64 || D == 128) && wgmma && wgmma_available();
  if (use_wgmma) {
    err =
        launch_bwd_dkdv_wgmma(D, static_cast<bf16*>(d_k), static_cast<bf16*>(d_v), partial, slices,
                              dsum, dout, qq, kk, vv, lse, cu, sh, scale_log2, grid_kv, stream);
    if (err != cudaSuccess) return err;
  }
  if (!use_wgmma) {
    err = cudaFuncSetAttribute(attention_bwd_dkdv_kernel<D, BQ, false>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem_kv);
    if (err != cudaSuccess) return err;
    attention_bwd_dkdv_kernel<D, BQ, false><<<grid_kv, kThreads, smem_kv, stream>>>(
        static_cast<bf16*>(d_k), static_cast<bf16*>(d_v), partial, slices, nullptr, dsum, dout, qq,
        kk, vv, lse, cu, sh, scale_log2);
  }
  if (partial != nullptr) {
    const std::int64_t n = sh.t * sh.g * D;
    attention_bwd_reduce_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
        static_cast<bf16*>(d_k), static_cast<bf16*>(d_v), partial, slices, n, sh.scale);
  }

  const dim3 grid_q(grid_blocks(sh.t, sh.s, kBK), static_cast<unsigned>(sh.h));
  if (use_wgmma) {
    return launch_bwd_dq_wgmma(D, dq, dsum, dout, qq, kk, vv, lse, cu, sh, scale_log2, grid_q,
                               stream);
  }
  const int smem_q = (2 * kBK + 4 * BN) * kStr * static_cast<int>(sizeof(bf16));
  err = cudaFuncSetAttribute(attention_bwd_dq_kernel<D, BN>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem_q);
  if (err != cudaSuccess) return err;
  attention_bwd_dq_kernel<D, BN>
      <<<grid_q, kThreads, smem_q, stream>>>(dq, dout, qq, kk, vv, lse, cu, sh, scale_log2);
  return cudaGetLastError();
}

// FERRY_ATTN_BWD_DQ=atomic: dQ accumulated by f32 atomics in the dK/dV kernel (non-deterministic,
// opt-in). Read at every call like the variables above, by attention_bwd_workspace_floats (hence
// Backend::workspace_bytes) and by the launch alike, so a process that sets it before it starts
// sizes and launches consistently. Should it change between the two, the launch still never
// reads or writes past the workspace it gets: too small for the accumulator -> deterministic.
bool bwd_dq_atomic() {
  const char* e = std::getenv("FERRY_ATTN_BWD_DQ");
  return e != nullptr && std::string_view(e) == "atomic";
}

// The dK/dV and dQ kernels with sm_90a warpgroup MMAs (attention_bwd_wgmma.cu) on the
// deterministic path at D = 64 / 128, wherever the build and the device have sm_90a: the default
// there since session 28 (H100, fwd + bwd vs torch SDPA 0.65-0.83x -> 0.81-1.00x, docs/cuda.md);
// FERRY_ATTN_BWD_WGMMA=0 runs the mma.sync kernels instead. Ignored on the atomic-dQ path (whose
// dQ step reads the mma.sync kernel's padded tiles). Read at every call like the variables above.
bool bwd_wgmma() {
  const char* e = std::getenv("FERRY_ATTN_BWD_WGMMA");
  return !(e != nullptr && e[0] == '0' && e[1] == '\0');
}

}  // namespace

std::int64_t attention_bwd_workspace_floats(std::int64_t t, std::int64_t h, std::int64_t g,
                                            std::int64_t d) {
  // Every query head its own slice: 2 (dK, dV) x [H, T, D] f32 (H = slices x G), none without
  // grouped heads (a group of one has nothing to split); atomic dQ (D = 64 / 128) puts its
  // accumulator and dsum in front.
  const std::int64_t partials = h == g ? 0 : 2 * t * h * d;
  if (bwd_dq_atomic() && (d == 64 || d == 128)) return atomic_dq_floats(t, h, d) + partials;
  return partials;
}

cudaError_t launch_attention_bwd(void* d_q, void* d_k, void* d_v, const void* d_out, const void* q,
                                 const void* k, const void* v, const void* out, const float* lse,
                                 const std::int32_t* cu_seqlens, AttnShape sh, float* workspace,
                                 std::int64_t workspace_floats, cudaStream_t stream) {
  if (sh.t == 0) return cudaSuccess;
  const bool atomic = bwd_dq_atomic();
  const bool wgmma = bwd_wgmma();
  switch (sh.d) {
    case 16:
      return launch_bwd_d<16, 64, 64>(d_q, d_k, d_v, d_out, q, k, v, out, lse, cu_seqlens, sh,
                                      workspace, workspace_floats, atomic, wgmma, stream);
    case 32:
      return launch_bwd_d<32, 64, 64>(d_q, d_k, d_v, d_out, q, k, v, out, lse, cu_seqlens, sh,
                                      workspace, workspace_floats, atomic, wgmma, stream);
    case 64:
      return launch_bwd_d<64, 64, 64>(d_q, d_k, d_v, d_out, q, k, v, out, lse, cu_seqlens, sh,
                                      workspace, workspace_floats, atomic, wgmma, stream);
    case 128:
      return launch_bwd_d<128, 32, 32>(d_q, d_k, d_v, d_out, q, k, v, out, lse, cu_seqlens, sh,
                                       workspace, workspace_floats, atomic, wgmma, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace ferry::kernels::cuda
