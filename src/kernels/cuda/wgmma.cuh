// SPDX-License-Identifier: Apache-2.0
// sm_90a warpgroup MMA (wgmma.mma_async) building blocks: the 128-byte-swizzled shared-memory
// tile layout the tensor cores read their operands from, the operand descriptors, the
// fence / commit / wait protocol, and the three instruction shapes the attention backward uses.
//
// Compiled for real only where the sm_90a feature set is (nvcc -arch sm_90a: the macro
// __CUDA_ARCH_FEAT_SM90_ALL); elsewhere each instruction wrapper traps, and the host never
// launches a kernel that uses them (wgmma_available() in launchers.h: built with 90a and running
// on a compute capability 9.0 device).
//
// Accumulator layout of m64nNk16 (f32, per thread): warp w of the warpgroup owns rows
// 16w .. 16w + 15 and holds them exactly as mma.sync m16n8k16 holds a 16 x N row block of C
// tiles: d[4j + 0, 1] = (row g, cols 8j + 2t, + 1), d[4j + 2, 3] = (row g + 8, same cols)
// (g = lane / 4, t = lane % 4). A register A operand (m64k16) is, per warp, an mma.sync A
// fragment of its 16 rows, so attention_common.cuh's c_to_a turns accumulators into A operands.
//
// Shared-memory tiles (swz128_*): a [rows][cols] bf16 tile, cols a multiple of 64, is stored as
// cols / 64 column blocks one after another, each rows x 128 bytes; in row r the 16-byte chunk c
// (elements 8c .. 8c + 7 of the block) sits at chunk c ^ (r & 7). A column block is then a stack
// of 8-row x 128-byte swizzle atoms (1024 bytes; the tile's base must be 1024-byte aligned), which
// the tensor cores read either way round:
//   K-major (the reduction runs along the row: K or Q rows as B of S = Q K^T, K or V rows as A
//     of S^T = K Q^T): a 16-wide k step kk is at byte (kk / 4) * block + (kk % 4) * 32 + row0 *
//     128; stride byte offset (between 8-row groups) 1024; leading byte offset unused (1).
//   MN-major (the reduction runs down the rows: dO or Q rows as B of dV = P^T dO, dK = dS^T Q,
//     N = the head dim contiguous): a 16-row k step at byte k0 * 128; leading byte offset =
//     the column-block stride (rows x 128), stride byte offset (between 8-row groups) 1024.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FERRY_WGMMA_ENABLED 1
#else
#define FERRY_WGMMA_ENABLED 0
#endif

namespace ferry::kernels::cuda::wgmma {

// Byte offset of element (row, col) in a swizzled tile of `rows` rows (file comment).
__device__ __forceinline__ std::uint32_t swz128_offset(int row, int col, int rows) {
  const int block = col >> 6, chunk = (col & 63) >> 3;
  return static_cast<std::uint32_t>(block * rows * 128 + row * 128 + ((chunk ^ (row & 7)) << 4) +
                                    (col & 7) * 2);
}

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte
// offsets (16-byte units, 14 bits each), base offset 0 (atoms 1024-byte aligned).
__device__ __forceinline__ std::uint64_t desc_swz128(const void* smem, std::uint32_t lbo_bytes,
                                                     std::uint32_t sbo_bytes) {
  const auto addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  std::uint64_t d = (addr & 0x3FFFFu) >> 4;
  d |= static_cast<std::uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16;
  d |= static_cast<std::uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32;
  d |= static_cast<std::uint64_t>(1) << 62;
  return d;
}

// K-major operand: rows row0 .. row0 + 63 (row0 a multiple of 8) of a swizzled [rows][cols] tile
// at base, k step kk (elements 16 kk .. 16 kk + 15).
__device__ __forceinline__ std::uint64_t desc_kmajor(const unsigned char* base, int rows, int row0,
                                                     int kk) {
  return desc_swz128(base + (kk >> 2) * rows * 128 + (kk & 3) * 32 + row0 * 128, 16, 1024);
}

// MN-major operand: rows k0 .. k0 + 15 (k0 a multiple of 16) of a swizzled [rows][N] tile.
__device__ __forceinline__ std::uint64_t desc_mnmajor(const unsigned char* base, int rows, int k0) {
  return desc_swz128(base + k0 * 128, static_cast<std::uint32_t>(rows * 128), 1024);
}

// Orders this thread's generic-proxy shared-memory writes (stores, cp.async after its wait) before
// the async proxy's reads (wgmma); a CTA barrier must follow before another warp's wgmma reads
// them.
__device__ __forceinline__ void fence_proxy_async() {
#if FERRY_WGMMA_ENABLED
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Before the first wgmma of a batch whose register operands were written by ordinary instructions.
__device__ __forceinline__ void fence() {
#if FERRY_WGMMA_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#if FERRY_WGMMA_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wait() {
#if FERRY_WGMMA_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Keeps the compiler from moving reads or writes of accumulator registers across a wait (the
// wgmma asm statements return before the hardware has written them).
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x 64] (+)= A[64 x 16] B[16 x 64]: A and B from shared memory (descriptors), both
// K-major. accumulate = false overwrites D (no zeroing needed).
__device__ __forceinline__ void mma_ss_m64n64k16(float (&d)[32], std::uint64_t desc_a,
                                                 std::uint64_t desc_b, bool accumulate) {
#if FERRY_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, "
      "0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));
#else
  (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
  __trap();
#endif
}

// D[64 x 64] += A[64 x 16] B[16 x 64]: A from registers (each warp's 16 rows as an mma.sync
// m16n8k16 A fragment), B from shared memory MN-major (N contiguous: a row-major [k][n] tile).
__device__ __forceinline__ void mma_rs_m64n64k16_bmn(float (&d)[32], const std::uint32_t (&a)[4],
                                                     std::uint64_t desc_b) {
#if FERRY_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, "
      "p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d, (void)a, (void)desc_b;
  __trap();
#endif
}

// D[64 x 128] += A[64 x 16] B[16 x 128]: A from registers (each warp's 16 rows as an mma.sync
// m16n8k16 A fragment), B from shared memory MN-major (N contiguous: a row-major [k][n] tile).
__device__ __forceinline__ void mma_rs_m64n128k16_bmn(float (&d)[64], const std::uint32_t (&a)[4],
                                                      std::uint64_t desc_b) {
#if FERRY_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, "
      "p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  (void)d, (void)a, (void)desc_b;
  __trap();
#endif
}
// D[64 x N] += A B for N = 64 or 128 (the head dim of dV, dK, dQ, O): the instruction of that
// width.
template <int N>
__device__ __forceinline__ void mma_rs_bmn(float (&d)[N / 2], const std::uint32_t (&a)[4],
                                           std::uint64_t desc_b) {
  static_assert(N == 64 || N == 128, "wgmma: N 64 or 128");
  if constexpr (N == 128) {
    mma_rs_m64n128k16_bmn(d, a, desc_b);
  } else {
    mma_rs_m64n64k16_bmn(d, a, desc_b);
  }
}

}  // namespace ferry::kernels::cuda::wgmma
