// SPDX-License-Identifier: Apache-2.0
// Building blocks of the flash-style attention kernels (attention_fwd.cu, attention_bwd.cu):
// bf16 tensor-core MMA (mma.sync m16n8k16, sm_80+, so it also runs on sm_86/89), the transposing
// shared-memory fragment load (ldmatrix .trans), bf16 pair packing, tile loads from the packed
// [T, heads, D] layout into padded shared memory, and the varlen block -> (sequence, block) map.
//
// Fragment layout of m16n8k16 (per lane: g = lane / 4, t = lane % 4), which every kernel relies on:
//   A (16x16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8,
//   2t+8..) B (16x8, "col"):      b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g) C (16x8, f32):
//   c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// So a C tile pair (n-tiles 2j, 2j+1) repacked to bf16 is exactly the A fragment of k-chunk j:
// the FlashAttention-2 register reuse of P (and dS) without a trip through shared memory.
#pragma once

#include "kernels/cuda/common.cuh"

namespace ferry::kernels::cuda::attn {

constexpr int kThreads = 128;  // 4 warps, 16 rows each
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ void mma_bf16(float (&c)[4], const std::uint32_t (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// B fragment of a 16(k) x 8(n) block stored row-major [k][n] in shared memory at `tile`
// (row stride `stride` elements): lanes 0..15 address rows k = lane.
__device__ __forceinline__ void ldmatrix_b_trans(std::uint32_t& b0, std::uint32_t& b1,
                                                 const bf16* tile, int stride) {
  const int lane = threadIdx.x & 31;
  const bf16* p = tile + (lane & 15) * stride;
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b0), "=r"(b1)
               : "r"(addr));
}

// B fragments of two adjacent n-tiles (n0..n0+7 and n0+8..n0+15) at k-chunk kk, from a tile stored
// [n][k] row-major (K or Q rows: n = row, k = head dim): one ldmatrix.x4 instead of four 32-bit
// loads. b[0], b[1] = (b0, b1) of n-tile n0; b[2], b[3] = of n-tile n0 + 8.
__device__ __forceinline__ void ldmatrix_b_pair(std::uint32_t (&b)[4], const bf16* tile, int stride,
                                                int n0, int kk) {
  const int lane = threadIdx.x & 31;
  const bf16* p =
      tile + (n0 + ((lane >> 4) << 3) + (lane & 7)) * stride + kk * 16 + (((lane >> 3) & 1) << 3);
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(addr));
}

// A fragment (16 rows x 16 k) of a row-major [rows][stride] smem tile at rows row0.., k-chunk kk,
// in one ldmatrix.x4: lanes 0-7 address rows 0-7 (-> a0), 8-15 rows 8-15 (-> a1), 16-23 rows 0-7
// at k + 8 (-> a2), 24-31 rows 8-15 at k + 8 (-> a3). Same registers as load_a.
__device__ __forceinline__ void ldmatrix_a(std::uint32_t (&a)[4], const bf16* tile, int stride,
                                           int row0, int kk) {
  const int lane = threadIdx.x & 31;
  const bf16* p = tile + (row0 + (lane & 15)) * stride + kk * 16 + ((lane >> 4) << 3);
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
}

// B fragments of two adjacent n-tiles (n 0..7 and 8..15 from `tile`) of a 16(k) x 16(n) block
// stored row-major [k][n] (V or dO rows: k = row, n = head dim), one ldmatrix.x4.trans: lanes 0-15
// address rows k = lane at n 0, lanes 16-31 rows k = lane - 16 at n 8. b[0], b[1] = (b0, b1) of
// the first n-tile, b[2], b[3] of the second (the x2 ldmatrix_b_trans twice, in one instruction).
__device__ __forceinline__ void ldmatrix_b_trans_pair(std::uint32_t (&b)[4], const bf16* tile,
                                                      int stride) {
  const int lane = threadIdx.x & 31;
  const bf16* p = tile + (lane & 15) * stride + ((lane >> 4) << 3);
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(addr));
}

// A fragment (16 m x 16 k) of the TRANSPOSE of a row-major [k][stride] smem tile: stored rows
// k0 .. k0 + 15 are the operand's k, stored columns m0 .. m0 + 15 its m (dS^T stored key-major,
// read as dS for dQ = dS K). One ldmatrix.x4.trans: matrix i = lane / 8 is (m half i & 1, k half
// i >> 1) — a0 (m 0-7, k 0-7), a1 (m 8-15, k 0-7), a2 (m 0-7, k 8-15), a3 (m 8-15, k 8-15) — each
// read as 8 stored rows (k) of 8 consecutive m; .trans hands lane (g, t) stored elements
// [2t][g], [2t+1][g] of each, i.e. A (g, 2t..2t+1): the load_a layout.
__device__ __forceinline__ void ldmatrix_a_trans(std::uint32_t (&a)[4], const bf16* tile,
                                                 int stride, int k0, int m0) {
  const int lane = threadIdx.x & 31;
  const bf16* p =
      tile + (k0 + ((lane >> 4) << 3) + (lane & 7)) * stride + m0 + (((lane >> 3) & 1) << 3);
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
}

// p[0..3] += (a, b, c, d) in global memory without a return value (p 16-byte aligned): one
// red.global.add.v4.f32 on sm_90 (PTX ISA 8.1+), four scalar f32 atomics before. The order in
// which concurrent adds land is not fixed: the sums are not bitwise reproducible.
__device__ __forceinline__ void red_add_f32x4(float* p, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c),
               "f"(d)
               : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
  atomicAdd(p + 2, c);
  atomicAdd(p + 3, d);
#endif
}

__device__ __forceinline__ std::uint32_t lds32(const bf16* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// A fragment for rows [row0, row0+16) and k-chunk `kk` of a row-major [rows][stride] smem tile.
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const bf16* tile, int stride,
                                       int row0, int kk) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bf16* p = tile + (row0 + g) * stride + kk * 16 + 2 * t;
  a[0] = lds32(p);
  a[1] = lds32(p + 8 * stride);
  a[2] = lds32(p + 8);
  a[3] = lds32(p + 8 * stride + 8);
}

// C tiles 2j and 2j+1 (f32) -> A fragment (bf16) of k-chunk j.
__device__ __forceinline__ void c_to_a(std::uint32_t (&a)[4], const float (&c0)[4],
                                       const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// Asynchronous 16-byte global -> shared copy (cp.async, sm_80+), zero-filling when !valid (the
// source address is then not read but must still be a valid pointer).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}
// 4-byte variant (per-row scalars such as lse).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until every committed group of this thread has landed (then __syncthreads for the CTA).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Copies rows [r0, r0 + rows) of one sequence (token offset s0, length len) and one head of a
// packed [T, heads, D] tensor into smem [rows][D + 8], rows at or past len zero-filled, through
// cp.async: the copy proceeds while the CTA computes on another buffer.
template <int D>
__device__ __forceinline__ void load_rows_async(bf16* dst, const bf16* src, std::int64_t s0,
                                                std::int64_t r0, std::int64_t len, int rows,
                                                std::int64_t heads, std::int64_t head) {
  constexpr int kVecPerRow = D / 8;
  constexpr int kStride = D + 8;
  for (int i = threadIdx.x; i < rows * kVecPerRow; i += blockDim.x) {
    const int r = i / kVecPerRow, c = (i % kVecPerRow) * 8;
    const std::int64_t rr = r0 + r;
    const bool ok = rr < len;
    cp_async16(dst + r * kStride + c, ok ? src + ((s0 + rr) * heads + head) * D + c : src, ok);
  }
}

// 2^x with the hardware approximation (rel. error ~2^-22, far below bf16's 2^-8 rounding of P).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Maps a flat block index to (sequence start, length, block within the sequence) for blocks of
// `bm` rows over the packed sequences. False for indices past the last block (the grid is an
// upper bound, ceil(T / bm) + S, because the host cannot read cu_seqlens without a sync).
struct SeqBlock {
  std::int64_t start, len, block, blocks;  // blocks: of this sequence
};
__device__ __forceinline__ bool find_block(const std::int32_t* cu, std::int64_t s, int bm,
                                           std::int64_t bid, SeqBlock* out) {
  for (std::int64_t i = 0; i < s; ++i) {
    const std::int64_t len = cu[i + 1] - cu[i];
    const std::int64_t nb = (len + bm - 1) / bm;
    if (bid < nb) {
      *out = {cu[i], len, bid, nb};
      return true;
    }
    bid -= nb;
  }
  return false;
}

inline unsigned grid_blocks(std::int64_t t, std::int64_t s, int bm) {
  return static_cast<unsigned>((t + bm - 1) / bm + s);
}

}  // namespace ferry::kernels::cuda::attn
