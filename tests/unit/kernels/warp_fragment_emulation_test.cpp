// SPDX-License-Identifier: Apache-2.0
// Host emulation of the warp-level instructions the CUDA attention kernels are built from, and a
// replay of those kernels' index math on it, so fragment layouts are checked without a GPU.
//
// Emulator (written from the PTX ISA text, not from src/kernels/cuda):
//   ldmatrix.sync.aligned.m8n8.{x2,x4}{.trans}.shared.b16: matrix i's row r is the 16-byte row
//     whose address lane 8 i + r supplies; without .trans lane l gets, in register i, row l / 4,
//     columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i (lower column in the low half); with .trans
//     (the matrix read column-major) rows 2 (l % 4), 2 (l % 4) + 1 of column l / 4.
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ("Matrix Fragments for mma.m16n8k16 with
//     floating point type"; g = lane >> 2, t = lane % 4): A a0..a7 (two per .b32 register, low
//     first) at row g for i in {0, 1, 4, 5} else g + 8, column 2t + (i & 1), + 8 for i >= 4;
//     B b0..b3 at row 2t + (i & 1), + 8 for i >= 2, column g; C/D c0..c3 at row g for i < 2 else
//     g + 8, column 2t + (i & 1). The emulator also checks that every A / B element is supplied
//     by exactly one lane.
//   shfl.sync.bfly (__shfl_xor_sync), red.global.add.v4.f32 (4 consecutive f32 at a 16-byte
//     aligned address), 32-bit shared loads (little-endian: the lower address in the low half).
//
// Replays: the kernels' address and fragment-index expressions, run per lane on the emulator.
// Each is written through PIN(file, expr): the expression is evaluated and its text must occur
// in that source file (whitespace ignored), so a kernel edit that changes one fails here until
// the replay follows it. Integer-valued bf16 data keeps every f32 sum exact, so results are
// compared bit for bit.
//   Controls (kernels whose GPU tests passed on the H200: KernelsAttention.* in
//   bench/kernels/results/h200_2026-12-01_s9_ctest_kernels.log): S^T = K Q^T
//   (load_a, ldmatrix_b_pair) and dK += dS^T Q (c_to_a, ldmatrix_b_trans) of the 16-key dK/dV
//   kernel; ldmatrix_a's lanes in a staged product (the removed 32-key kernel's dK product).
//   Target: atomic dQ (attention_bwd_dkdv_kernel<D, BQ, true>): the dS^T staging stores, dQ = dS K
//   through ldmatrix_a_trans / ldmatrix_b_trans_pair, the lane-pair shuffle and the v4 adds, for
//   one tile and for whole launches (varlen, causal, GQA, slices) including the workspace layout
//   (accumulator, dsum [H, T], partials) and the dsum kernel's writes.
// Not covered here: barrier placement and races (the kernels run their warps one after another
// here; reasoned in attention_bwd.cu, racecheck on the GPU), the real MMAs' f32 rounding order
// (the sums here are exact), dK / dV bit identity with the deterministic path (GPU test).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace ferry::kernels {
namespace {

constexpr const char* kBwd = "src/kernels/cuda/attention_bwd.cu";
constexpr const char* kCommon = "src/kernels/cuda/attention_common.cuh";
constexpr const char* kBwdCommon = "src/kernels/cuda/attention_bwd_common.cuh";

// ---------------------------------------------------------------------------------------------
// Pinning replayed expressions to the kernel sources.

std::string squeeze(const std::string& s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) out += c;
  return out;
}

const std::string& squeezed_source(const char* rel) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(rel);
  if (it != cache.end()) return it->second;
  std::ifstream f(std::string(FERRY_TEST_DATA_DIR) + "/../../" + rel);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_TRUE(f.good() || f.eof()) << "cannot read " << rel;
  return cache.emplace(rel, squeeze(ss.str())).first->second;
}

// Checked once per distinct literal (the macro's string has static storage).
void pin(const char* file, const char* text) {
  static std::set<const void*> seen;
  if (!seen.insert(text).second) return;
  EXPECT_NE(squeezed_source(file).find(squeeze(text)), std::string::npos)
      << "replayed expression not found in " << file << ": " << text;
}
#define PIN(file, ...) (pin(file, #__VA_ARGS__), (__VA_ARGS__))

// ---------------------------------------------------------------------------------------------
// bf16, shared memory, registers.

using u16 = std::uint16_t;
using u32 = std::uint32_t;

u16 to_bf16(float x) {  // round to nearest even (finite inputs)
  u32 u;
  std::memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<u16>(u >> 16);
}
float from_bf16(u16 b) {
  const u32 u = static_cast<u32>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
// pack_bf16(lo, hi) = __floats2bfloat162_rn(lo, hi) as a .b32: .x (lo) at the lower address.
u32 pack_bf16(float lo, float hi) {
  pin(kCommon,
      "const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); return *reinterpret_cast<const "
      "std::uint32_t*>(&v);");
  return static_cast<u32>(to_bf16(lo)) | (static_cast<u32>(to_bf16(hi)) << 16);
}

constexpr u16 kPoison = 0x7fc0;  // bf16 NaN: an unwritten shared element read by an MMA shows

// Shared memory of one CTA in bf16 units (an f32 takes two); offset 0 is 16-byte aligned.
struct Smem {
  std::vector<u16> h;
  explicit Smem(std::int64_t elems) : h(static_cast<std::size_t>(elems), kPoison) {}
  void store32(std::int64_t a, u32 v) {
    EXPECT_EQ(a % 2, 0) << "misaligned 32-bit store";
    EXPECT_TRUE(a >= 0 && a + 2 <= static_cast<std::int64_t>(h.size())) << "store out of smem";
    h[a] = static_cast<u16>(v & 0xffffu);
    h[a + 1] = static_cast<u16>(v >> 16);
  }
};

// lds32: one 32-bit shared load (little-endian).
u32 lds32(const Smem& s, std::int64_t a) {
  EXPECT_EQ(a % 2, 0) << "misaligned 32-bit load";
  return static_cast<u32>(s.h.at(a)) | (static_cast<u32>(s.h.at(a + 1)) << 16);
}

template <int N>
using Regs = std::array<std::array<u32, N>, 32>;  // [lane][register]
using Lanes = std::array<std::int64_t, 32>;       // per-lane smem address (bf16 units)
using CFrag = std::array<std::array<float, 4>, 32>;

int ldmatrix_errors = 0;

// ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16 (header comment).
template <int N>
Regs<N> ldmatrix(const Smem& s, const Lanes& addr, bool trans) {
  static_assert(N == 1 || N == 2 || N == 4);
  Regs<N> r{};
  for (int i = 0; i < N; ++i) {
    u16 m[8][8];
    for (int row = 0; row < 8; ++row) {
      const std::int64_t a = addr[8 * i + row];
      if (a % 8 != 0 || a < 0 || a + 8 > static_cast<std::int64_t>(s.h.size())) {
        ++ldmatrix_errors;
        ADD_FAILURE() << "ldmatrix row address " << a << " (lane " << 8 * i + row
                      << ") not 16-byte aligned or outside shared memory";
        return r;
      }
      for (int col = 0; col < 8; ++col) m[row][col] = s.h[a + col];
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int rr = lane / 4, cc = 2 * (lane % 4);
      const u16 lo = trans ? m[cc][rr] : m[rr][cc];
      const u16 hi = trans ? m[cc + 1][rr] : m[rr][cc + 1];
      r[lane][i] = static_cast<u32>(lo) | (static_cast<u32>(hi) << 16);
    }
  }
  return r;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: c = A B + c (header comment).
void mma(CFrag& c, const Regs<4>& a, const Regs<2>& b) {
  pin(kCommon,
      "\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, \" "
      "\"{%8,%9}, {%0,%1,%2,%3};\\n\" : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3]) "
      ": \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b0), \"r\"(b1)");
  double am[16][16], bm[16][8];
  int aset[16][16] = {}, bset[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane % 4;
    for (int i = 0; i < 8; ++i) {
      const u32 reg = a[lane][i / 2];
      const u16 v = static_cast<u16>(i % 2 == 0 ? reg & 0xffffu : reg >> 16);
      const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
      const int col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
      am[row][col] = from_bf16(v);
      ++aset[row][col];
    }
    for (int i = 0; i < 4; ++i) {
      const u32 reg = b[lane][i / 2];
      const u16 v = static_cast<u16>(i % 2 == 0 ? reg & 0xffffu : reg >> 16);
      const int row = t * 2 + (i & 1) + (i >= 2 ? 8 : 0);
      bm[row][g] = from_bf16(v);
      ++bset[row][g];
    }
  }
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 16; ++k) EXPECT_EQ(aset[r][k], 1) << "A element set != once";
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) EXPECT_EQ(bset[k][n], 1) << "B element set != once";
  float d[16][8];
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      double acc = 0;
      for (int k = 0; k < 16; ++k) acc += am[m][k] * bm[k][n];
      d[m][n] = static_cast<float>(acc);
    }
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane % 4;
    for (int i = 0; i < 4; ++i) c[lane][i] += d[i < 2 ? g : g + 8][t * 2 + (i & 1)];
  }
}

Regs<2> regs2(const Regs<4>& r, int first) {
  Regs<2> o{};
  for (int l = 0; l < 32; ++l) o[l] = {r[l][first], r[l][first + 1]};
  return o;
}

// shfl.sync.bfly.b32 with a full mask: lane l reads lane l ^ mask.
std::array<float, 32> shfl_xor(const std::array<float, 32>& v, int mask) {
  std::array<float, 32> o{};
  for (int l = 0; l < 32; ++l) o[l] = v[l ^ mask];
  return o;
}

// Global f32 memory for red.global.add.v4.f32 (the workspace), and the adds' log.
struct Global {
  std::vector<float> f;
  std::int64_t adds = 0;
};
Global* g_mem = nullptr;
// red.global.add.v4.f32 [p], {a, b, c, d}: p 16-byte aligned (offset in floats from a 16-byte
// aligned base), the four f32 at p .. p + 3 each += one value.
void red_add_f32x4(std::int64_t p, float a, float b, float c, float d) {
  pin(kCommon,
      "asm volatile(\"red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\\n\" ::\"l\"(p), \"f\"(a), "
      "\"f\"(b), \"f\"(c), \"f\"(d)");
  Global& m = *g_mem;
  if (p % 4 != 0 || p < 0 || p + 4 > static_cast<std::int64_t>(m.f.size())) {
    ADD_FAILURE() << "red.v4 address " << p << " misaligned or outside the workspace ("
                  << m.f.size() << " floats)";
    return;
  }
  m.f[p] += a;
  m.f[p + 1] += b;
  m.f[p + 2] += c;
  m.f[p + 3] += d;
  ++m.adds;
}

// Small integers: exact in bf16, and every sum below stays exact in f32.
float small_int(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<float>(static_cast<int>(x % 7) - 3);
}

constexpr int kBK = 64;  // attention_bwd.cu

// ---------------------------------------------------------------------------------------------
// Per-lane address expressions of the attention_common.cuh helpers (the helpers' bodies).

// ldmatrix_b_trans (x2 .trans): rows k = lane & 15.
Lanes addr_b_trans(std::int64_t tile, int stride) {
  pin(kCommon,
      "const bf16* p = tile + (lane & 15) * stride; const unsigned addr = "
      "static_cast<unsigned>(__cvta_generic_to_shared(p)); asm volatile(\"ldmatrix.sync.aligned."
      "m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\\n\" : \"=r\"(b0), \"=r\"(b1)");
  Lanes a{};
  for (int lane = 0; lane < 32; ++lane) a[lane] = PIN(kCommon, tile + (lane & 15) * stride);
  return a;
}
// ldmatrix_b_pair (x4).
Lanes addr_b_pair(std::int64_t tile, int stride, int n0, int kk) {
  pin(kCommon,
      "(((lane >> 3) & 1) << 3); const unsigned addr = static_cast<unsigned>(__cvta_generic_to_"
      "shared(p)); asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, "
      "[%4];\\n\" : \"=r\"(b[0]), \"=r\"(b[1]), \"=r\"(b[2]), \"=r\"(b[3])");
  Lanes a{};
  for (int lane = 0; lane < 32; ++lane)
    a[lane] = PIN(kCommon, tile + (n0 + ((lane >> 4) << 3) + (lane & 7)) * stride + kk * 16 +
                               (((lane >> 3) & 1) << 3));
  return a;
}
// ldmatrix_a (x4).
Lanes addr_a(std::int64_t tile, int stride, int row0, int kk) {
  pin(kCommon,
      "kk * 16 + ((lane >> 4) << 3); const unsigned addr = static_cast<unsigned>(__cvta_generic_"
      "to_shared(p)); asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, "
      "[%4];\\n\" : \"=r\"(a[0]), \"=r\"(a[1]), \"=r\"(a[2]), \"=r\"(a[3])");
  Lanes a{};
  for (int lane = 0; lane < 32; ++lane)
    a[lane] = PIN(kCommon, tile + (row0 + (lane & 15)) * stride + kk * 16 + ((lane >> 4) << 3));
  return a;
}
// ldmatrix_b_trans_pair (x4 .trans).
Lanes addr_b_trans_pair(std::int64_t tile, int stride) {
  pin(kCommon,
      "const bf16* p = tile + (lane & 15) * stride + ((lane >> 4) << 3); const unsigned addr = "
      "static_cast<unsigned>(__cvta_generic_to_shared(p)); asm volatile(\"ldmatrix.sync.aligned."
      "m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\\n\" : \"=r\"(b[0]), \"=r\"(b[1]), "
      "\"=r\"(b[2]), \"=r\"(b[3])");
  Lanes a{};
  for (int lane = 0; lane < 32; ++lane)
    a[lane] = PIN(kCommon, tile + (lane & 15) * stride + ((lane >> 4) << 3));
  return a;
}
// ldmatrix_a_trans (x4 .trans).
Lanes addr_a_trans(std::int64_t tile, int stride, int k0, int m0) {
  pin(kCommon,
      "m0 + (((lane >> 3) & 1) << 3); const unsigned addr = static_cast<unsigned>(__cvta_generic_"
      "to_shared(p)); asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, "
      "[%4];\\n\" : \"=r\"(a[0]), \"=r\"(a[1]), \"=r\"(a[2]), \"=r\"(a[3])");
  Lanes a{};
  for (int lane = 0; lane < 32; ++lane)
    a[lane] = PIN(kCommon, tile + (k0 + ((lane >> 4) << 3) + (lane & 7)) * stride + m0 +
                               (((lane >> 3) & 1) << 3));
  return a;
}
// load_a: four lds32 per lane.
Regs<4> load_a(const Smem& s, std::int64_t tile, int stride, int row0, int kk) {
  Regs<4> r{};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    const std::int64_t p = PIN(kCommon, tile + (row0 + g) * stride + kk * 16 + 2 * t);
    r[lane][0] = lds32(s, PIN(kCommon, p));
    r[lane][1] = lds32(s, PIN(kCommon, p + 8 * stride));
    r[lane][2] = lds32(s, PIN(kCommon, p + 8));
    r[lane][3] = lds32(s, PIN(kCommon, p + 8 * stride + 8));
  }
  return r;
}
// c_to_a: C tiles 2j, 2j + 1 -> the A fragment of k-chunk j.
Regs<4> c_to_a(const CFrag& c0f, const CFrag& c1f) {
  Regs<4> r{};
  for (int lane = 0; lane < 32; ++lane) {
    const auto& c0 = c0f[lane];
    const auto& c1 = c1f[lane];
    auto& a = r[lane];
    a[0] = PIN(kCommon, pack_bf16(c0[0], c0[1]));
    a[1] = PIN(kCommon, pack_bf16(c0[2], c0[3]));
    a[2] = PIN(kCommon, pack_bf16(c1[0], c1[1]));
    a[3] = PIN(kCommon, pack_bf16(c1[2], c1[3]));
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// The 16-key dK/dV kernel's shared-memory layout (attention_bwd_dkdv_kernel, in bf16 units).
template <int D, int BQ>
struct DkdvSmem {
  static constexpr int kStr = D + 8;
  static constexpr int kTile = BQ * kStr;
  static constexpr int kDsStr = BQ + 8;
  static constexpr std::int64_t ks = 0;
  static constexpr std::int64_t vs = ks + kBK * kStr;
  static constexpr std::int64_t qbuf = vs + kBK * kStr;
  static constexpr std::int64_t dobuf = qbuf + 2 * kTile;
  static constexpr std::int64_t lsebuf = dobuf + 2 * kTile;     // f32
  static constexpr std::int64_t dsumbuf = lsebuf + 2 * BQ * 2;  // f32: 2 BQ floats after lsebuf
  static constexpr std::int64_t dss = dsumbuf + 2 * BQ * 2;     // bf16 [kBK][kDsStr]
  static constexpr std::int64_t end = dss + kBK * kDsStr;
  // launch_bwd_d's dynamic shared memory (bytes): smem_kv, and smem_dq with the staging tile.
  static constexpr int smem_kv = (2 * kBK + 4 * BQ) * kStr * 2 + 4 * BQ * 4;
  static constexpr int smem_dq = smem_kv + kBK * (BQ + 8) * 2;
};

template <int D, int BQ>
void check_layout() {
  using L = DkdvSmem<D, BQ>;
  EXPECT_EQ(L::dss * 2, L::smem_kv) << "the staging tile starts where smem_kv ends";
  EXPECT_EQ(L::end * 2, L::smem_dq) << "smem_dq covers the staging tile exactly";
  EXPECT_EQ(L::dss % 8, 0) << "staging tile 16-byte aligned";
  EXPECT_EQ(L::kDsStr % 8, 0) << "staging rows 16-byte aligned (ldmatrix rows)";
  EXPECT_LE(L::smem_dq, 227 * 1024) << "fits sm_90's opt-in shared memory";
}

TEST(WarpFragmentEmulation, FusedKernelSharedLayout) {
  check_layout<64, 64>();
  check_layout<128, 32>();
}

// ---------------------------------------------------------------------------------------------
// Controls.

// S^T = K Q^T for each warp's 16 keys x BQ queries (attention_bwd_dkdv_kernel: load_a of K,
// ldmatrix_b_pair of Q), read back through the kernel's C-fragment indexing (kr[e >> 1], ql).
template <int D, int BQ>
void control_st() {
  using L = DkdvSmem<D, BQ>;
  constexpr int kStr = L::kStr;
  Smem s(L::end);
  float kq[kBK][D], qm[BQ][D];
  for (int r = 0; r < kBK; ++r)
    for (int c = 0; c < D; ++c)
      s.h[L::ks + r * kStr + c] = to_bf16(kq[r][c] = small_int(r * D + c));
  const std::int64_t qs = L::qbuf + L::kTile;  // buffer 1
  for (int r = 0; r < BQ; ++r)
    for (int c = 0; c < D; ++c)
      s.h[qs + r * kStr + c] = to_bf16(qm[r][c] = small_int(9000 + r * D + c));
  for (int warp = 0; warp < 4; ++warp) {
    std::vector<CFrag> st(BQ / 8, CFrag{});
    for (int kk = 0; kk < D / 16; ++kk) {
      const Regs<4> ak = load_a(s, L::ks, kStr, warp * 16, kk);
      for (int nt = 0; nt < BQ / 8; nt += 2) {
        const Regs<4> bq = ldmatrix<4>(s, addr_b_pair(qs, kStr, nt * 8, kk), false);
        mma(st[nt], ak, regs2(bq, 0));
        mma(st[nt + 1], ak, regs2(bq, 2));
      }
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      const std::int64_t kr[2] = {warp * 16 + g, warp * 16 + g + 8};  // k0 = 0
      for (int nt = 0; nt < BQ / 8; ++nt)
        for (int e = 0; e < 4; ++e) {
          const int ql = PIN(kBwd, nt * 8 + 2 * t + (e & 1));
          double want = 0;
          for (int c = 0; c < D; ++c) want += double(kq[kr[e >> 1]][c]) * qm[ql][c];
          ASSERT_EQ(st[nt][lane][e], want) << "S^T warp " << warp << " lane " << lane;
        }
    }
  }
}

// dK += dS^T Q from dS^T held as C fragments (c_to_a) and Q through ldmatrix_b_trans, read back
// through the kernel's dK store indexing (key warp * 16 + g + 8 r, dim nd * 8 + 2 t + j).
template <int D, int BQ>
void control_dk() {
  using L = DkdvSmem<D, BQ>;
  constexpr int kStr = L::kStr;
  Smem s(L::end);
  const std::int64_t qs = L::qbuf;
  float qm[BQ][D], dst[kBK][BQ];
  for (int r = 0; r < BQ; ++r)
    for (int c = 0; c < D; ++c) s.h[qs + r * kStr + c] = to_bf16(qm[r][c] = small_int(r * D + c));
  for (int k = 0; k < kBK; ++k)
    for (int q = 0; q < BQ; ++q) dst[k][q] = small_int(5555 + k * BQ + q);
  for (int warp = 0; warp < 4; ++warp) {
    std::vector<CFrag> dpt(BQ / 8), dk(D / 8, CFrag{});
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      for (int nt = 0; nt < BQ / 8; ++nt)
        for (int e = 0; e < 4; ++e)
          dpt[nt][lane][e] = dst[warp * 16 + g + 8 * (e >> 1)][nt * 8 + 2 * t + (e & 1)];
    }
    for (int kc = 0; kc < BQ / 16; ++kc) {
      const Regs<4> ads = c_to_a(dpt[2 * kc], dpt[2 * kc + 1]);
      for (int nd = 0; nd < D / 8; ++nd) {
        const Regs<2> b =
            ldmatrix<2>(s, addr_b_trans(PIN(kBwd, qs + kc * 16 * kStr + nd * 8), kStr), true);
        mma(dk[nd], ads, b);
      }
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      for (int r = 0; r < 2; ++r)
        for (int nd = 0; nd < D / 8; ++nd)
          for (int j = 0; j < 2; ++j) {
            const int key = warp * 16 + g + 8 * r, dim = nd * 8 + 2 * t + j;
            double want = 0;
            for (int q = 0; q < BQ; ++q) want += double(dst[key][q]) * qm[q][dim];
            ASSERT_EQ(dk[nd][lane][2 * r + j], want) << "dK warp " << warp << " lane " << lane;
          }
    }
  }
}

// A row-major A tile read by ldmatrix_a (attention_common.cuh; the mma.sync forward's Q fragments
// use it) times a B tile read by ldmatrix_b_trans_pair: dK[mt] += dS^T ([kBK][BQ + 8] tile) x Q,
// warp (kg, half): keys kg * 32 .., dims half * D/2 ... The product of the 32-keys-per-warp dK/dV
// kernel, which session 31 removed; kept as the check of addr_a's lane addresses (pinned to
// ldmatrix_a) on the emulator. The Q address is no longer pinned to a kernel.
template <int D, int BQ>
void control_ldmatrix_a_product() {
  constexpr int kStr = D + 8, kXStr = BQ + 8, kDH = D / 2;
  const std::int64_t qs = 0, dss = BQ * kStr;
  Smem s(dss + kBK * kXStr);
  float qm[BQ][D], dst[kBK][BQ];
  for (int r = 0; r < BQ; ++r)
    for (int c = 0; c < D; ++c) s.h[qs + r * kStr + c] = to_bf16(qm[r][c] = small_int(r * D + c));
  for (int k = 0; k < kBK; ++k)
    for (int q = 0; q < BQ; ++q)
      s.h[dss + k * kXStr + q] = to_bf16(dst[k][q] = small_int(77 + k * BQ + q));
  for (int warp = 0; warp < 4; ++warp) {
    const int kg = warp & 1, half = warp >> 1, krow0 = kg * 32, dh0 = half * kDH;
    std::vector<CFrag> dk(2 * (kDH / 8), CFrag{});
    for (int kc = 0; kc < BQ / 16; ++kc) {
      Regs<4> da[2];
      for (int mt = 0; mt < 2; ++mt)
        da[mt] = ldmatrix<4>(s, addr_a(dss, kXStr, krow0 + mt * 16, kc), false);
      for (int nt = 0; nt < kDH / 8; nt += 2) {
        const Regs<4> b =
            ldmatrix<4>(s, addr_b_trans_pair(qs + kc * 16 * kStr + dh0 + nt * 8, kStr), true);
        for (int mt = 0; mt < 2; ++mt) {
          mma(dk[mt * (kDH / 8) + nt], da[mt], regs2(b, 0));
          mma(dk[mt * (kDH / 8) + nt + 1], da[mt], regs2(b, 2));
        }
      }
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      for (int mt = 0; mt < 2; ++mt)
        for (int r = 0; r < 2; ++r)
          for (int nt = 0; nt < kDH / 8; ++nt)
            for (int j = 0; j < 2; ++j) {
              const int key = krow0 + mt * 16 + g + 8 * r, dim = dh0 + nt * 8 + 2 * t + j;
              double want = 0;
              for (int q = 0; q < BQ; ++q) want += double(dst[key][q]) * qm[q][dim];
              ASSERT_EQ(dk[mt * (kDH / 8) + nt][lane][2 * r + j], want)
                  << "ldmatrix_a product, warp " << warp << " lane " << lane;
            }
    }
  }
}

TEST(WarpFragmentEmulation, ControlDeterministicKernelsProducts) {
  control_st<64, 64>();
  control_st<128, 32>();
  control_dk<64, 64>();
  control_dk<128, 32>();
  control_ldmatrix_a_product<64, 64>();
  control_ldmatrix_a_product<128, 32>();
  EXPECT_EQ(ldmatrix_errors, 0);
}

// ---------------------------------------------------------------------------------------------
// Target: the atomic-dQ step of attention_bwd_dkdv_kernel<D, BQ, true>.

struct Shape {  // AttnShape's fields that the index math reads
  std::int64_t t, h, g, s;
  bool causal;
};
struct DsumRef {  // attention_bwd_common.cuh's DsumRef with the workspace as base 0
  std::int64_t base, tok_stride, head_stride;
  std::int64_t at(std::int64_t tok, std::int64_t h) const {
    return PIN(kBwdCommon, base + tok * tok_stride + h * head_stride);
  }
};

// dq_tile_atomic<D, BQ>: one warp's dQ_tile += dS K over the CTA's kBK keys, added into dq_acc
// (float offset into *g_mem). ks, dss: shared offsets (bf16 units).
template <int D, int BQ>
void dq_tile_atomic(int warp, std::int64_t dq_acc, const Smem& sm, std::int64_t dss,
                    std::int64_t ks, std::int64_t h, std::int64_t q0, std::int64_t s0,
                    std::int64_t len, const Shape& sh) {
  constexpr int kStr = D + 8;
  constexpr int kDsStr = BQ + 8;
  constexpr int kDW = D / 4;
  constexpr int kMT = BQ / 16;
  const int dw0 = PIN(kBwd, warp * kDW);
  std::vector<CFrag> dq(kMT * (kDW / 8), CFrag{});  // [mt][j]
  for (int kc = 0; kc < kBK / 16; ++kc) {
    std::vector<Regs<4>> bk(kDW / 16);
    for (int np = 0; np < kDW / 16; ++np)
      bk[np] = ldmatrix<4>(
          sm, addr_b_trans_pair(PIN(kBwd, ks + kc * 16 * kStr + dw0 + np * 16), kStr), true);
    for (int mt = 0; mt < kMT; ++mt) {
      pin(kBwd, "ldmatrix_a_trans(a, dss, kDsStr, kc * 16, mt * 16)");
      const Regs<4> a = ldmatrix<4>(sm, addr_a_trans(dss, kDsStr, kc * 16, mt * 16), true);
      for (int np = 0; np < kDW / 16; ++np) {
        pin(kBwd, "mma_bf16(dq[mt][2 * np], a, bk[np][0], bk[np][1])");
        pin(kBwd, "mma_bf16(dq[mt][2 * np + 1], a, bk[np][2], bk[np][3])");
        mma(dq[mt * (kDW / 8) + 2 * np], a, regs2(bk[np], 0));
        mma(dq[mt * (kDW / 8) + 2 * np + 1], a, regs2(bk[np], 2));
      }
    }
  }
  pin(kBwd, "__shfl_xor_sync(0xffffffffu, odd ? c[0] : c[2], 1)");
  pin(kBwd, "__shfl_xor_sync(0xffffffffu, odd ? c[1] : c[3], 1)");
  for (int mt = 0; mt < kMT; ++mt)
    for (int j = 0; j < kDW / 8; ++j) {
      const CFrag& cf = dq[mt * (kDW / 8) + j];
      std::array<float, 32> s0v{}, s1v{};
      for (int lane = 0; lane < 32; ++lane) {
        const int t = lane & 3;
        const bool odd = PIN(kBwd, (t & 1) != 0);
        const auto& c = cf[lane];
        s0v[lane] = PIN(kBwd, odd ? c[0] : c[2]);
        s1v[lane] = PIN(kBwd, odd ? c[1] : c[3]);
      }
      const auto r0v = shfl_xor(s0v, 1), r1v = shfl_xor(s1v, 1);
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        const bool odd = (t & 1) != 0;
        const int col = PIN(kBwd, dw0 + 2 * (t & 2));
        const std::int64_t row = PIN(kBwd, q0 + mt * 16 + g + (odd ? 8 : 0));
        const std::int64_t dst = PIN(kBwd, dq_acc + ((s0 + row) * sh.h + h) * D + col);
        const auto& c = cf[lane];
        const float r0 = r0v[lane], r1 = r1v[lane];
        if (PIN(kBwd, row < len))
          PIN(kBwd, red_add_f32x4(dst + j * 8, odd ? r0 : c[0], odd ? r1 : c[1], odd ? c[2] : r0,
                                  odd ? c[3] : r1));
      }
    }
}

// One (head, query tile) item of one CTA on the emulator: the warps' dS^T C fragments (values
// from ds(q, key) at the kernel's C indexing, 0 where the kernel's mask says so) stored to the
// staging tile by the kernel's store expression, then every warp's dq_tile_atomic. ds takes
// sequence-local (query, key) indices; the caller has put the K tile into sm.
template <int D, int BQ>
void run_item(Smem& sm, std::int64_t dq_acc, std::int64_t h, std::int64_t q0, std::int64_t k0,
              std::int64_t s0, std::int64_t len, const Shape& sh,
              const std::function<float(std::int64_t, std::int64_t)>& ds) {
  using L = DkdvSmem<D, BQ>;
  constexpr int kDsStr = L::kDsStr;
  const std::int64_t dss = L::dss;
  for (int warp = 0; warp < 4; ++warp) {
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane & 3;
      const std::int64_t kr[2] = {PIN(kBwd, k0 + warp * 16 + g), PIN(kBwd, k0 + warp * 16 + g + 8)};
      float dpt[BQ / 8][4];
      for (int nt = 0; nt < BQ / 8; ++nt)
        for (int e = 0; e < 4; ++e) {
          const int ql = nt * 8 + 2 * t + (e & 1);
          const std::int64_t qi = q0 + ql;
          const bool causal = sh.causal;  // p_and_ds's parameter (attention_bwd_common.cuh)
          const bool ok =
              PIN(kBwdCommon, qi < len && kr[e >> 1] < len && (!causal || qi >= kr[e >> 1]));
          dpt[nt][e] = ok ? ds(qi, kr[e >> 1]) : 0.0f;
        }
      for (int nt = 0; nt < BQ / 8; ++nt)
        for (int r = 0; r < 2; ++r)
          sm.store32(PIN(kBwd, dss + (warp * 16 + g + 8 * r) * kDsStr + nt * 8 + 2 * t),
                     PIN(kBwd, pack_bf16(dpt[nt][2 * r], dpt[nt][2 * r + 1])));
    }
  }
  // __syncthreads, then every warp's dQ step.
  for (int warp = 0; warp < 4; ++warp)
    dq_tile_atomic<D, BQ>(warp, dq_acc, sm, dss, L::ks, h, q0, s0, len, sh);
}

// One tile, every element checked: dS [BQ x kBK] (rows past len and the causal mask zero), K.
template <int D, int BQ>
void one_tile(std::int64_t len, bool causal, std::int64_t k0, std::int64_t q0) {
  using L = DkdvSmem<D, BQ>;
  constexpr int kStr = L::kStr;
  const Shape sh{len, 3, 1, 1, causal};
  const std::int64_t h = 2, s0 = 0;
  Smem sm(L::end);
  for (int r = 0; r < kBK; ++r)
    for (int c = 0; c < D; ++c)
      sm.h[L::ks + r * kStr + c] = to_bf16(k0 + r < len ? small_int(100 + r * D + c) : 0.0f);
  auto ds = [&](std::int64_t qi, std::int64_t kj) { return small_int(7 + qi * 1000 + kj); };
  Global mem;
  mem.f.assign(static_cast<std::size_t>(sh.t * sh.h * D), 0.0f);
  g_mem = &mem;
  run_item<D, BQ>(sm, 0, h, q0, k0, s0, len, sh, ds);
  g_mem = nullptr;
  for (std::int64_t tok = 0; tok < sh.t; ++tok)
    for (std::int64_t hh = 0; hh < sh.h; ++hh)
      for (int d = 0; d < D; ++d) {
        double want = 0;
        const bool in_tile = hh == h && tok >= q0 && tok < q0 + BQ;
        if (in_tile)
          for (std::int64_t kj = k0; kj < std::min(len, k0 + kBK); ++kj)
            if (!causal || tok >= kj)
              want += double(ds(tok, kj)) * small_int(100 + (kj - k0) * D + d);
        ASSERT_EQ(mem.f[(tok * sh.h + hh) * D + d], want)
            << "dQ tok " << tok << " head " << hh << " dim " << d << " (D " << D << ", BQ " << BQ
            << ", len " << len << ", causal " << causal << ")";
      }
  // One v4 add per (warp, m-tile, n-tile, lane) whose row is below len.
  std::int64_t rows_in = 0;
  for (std::int64_t r = q0; r < q0 + BQ; ++r) rows_in += r < len;
  EXPECT_EQ(mem.adds, 4 * (D / 4 / 8) * rows_in * 2) << "adds";
}

TEST(WarpFragmentEmulation, AtomicDqTileMatchesDsTimesK) {
  one_tile<64, 64>(200, false, 64, 0);
  one_tile<64, 64>(200, true, 64, 64);  // the diagonal tile
  one_tile<64, 64>(100, true, 64, 64);  // key and query tails
  one_tile<128, 32>(200, false, 128, 32);
  one_tile<128, 32>(200, true, 64, 96);  // causal, q0 past k0
  one_tile<128, 32>(90, true, 64, 64);   // tails
  EXPECT_EQ(ldmatrix_errors, 0);
}

// ---------------------------------------------------------------------------------------------
// Whole launches: launch_bwd_d's workspace split and slices, the dsum kernel's writes, the grid
// (find_block), every CTA's items, on the emulator; the accumulator must equal dS K summed over
// exactly the (query, key) pairs attention allows, and nothing else in the workspace may move.

std::int64_t atomic_dq_floats(std::int64_t t, std::int64_t h, std::int64_t d) {
  return PIN(kBwd, t * h * d + (t * h + 3) / 4 * 4);
}

struct SeqBlock {
  std::int64_t start, len, block, blocks;
};
bool find_block(const std::vector<std::int32_t>& cu, std::int64_t s, int bm, std::int64_t bid,
                SeqBlock* out) {
  for (std::int64_t i = 0; i < s; ++i) {
    const std::int64_t len = cu[i + 1] - cu[i];
    const std::int64_t nb = PIN(kCommon, (len + bm - 1) / bm);
    if (bid < nb) {
      *out = {cu[i], len, bid, nb};
      return true;
    }
    bid -= nb;
  }
  return false;
}

template <int D, int BQ>
void whole_launch(const std::vector<std::int64_t>& lens, std::int64_t H, std::int64_t G,
                  bool causal, int ws_mode) {
  std::vector<std::int32_t> cu{0};
  for (auto l : lens) cu.push_back(cu.back() + static_cast<std::int32_t>(l));
  const Shape sh{cu.back(), H, G, static_cast<std::int64_t>(lens.size()), causal};
  const std::string what = "D " + std::to_string(D) + " T " + std::to_string(sh.t) + " H " +
                           std::to_string(H) + " G " + std::to_string(G) + " causal " +
                           std::to_string(causal) + " ws_mode " + std::to_string(ws_mode);
  using L = DkdvSmem<D, BQ>;
  constexpr int kStr = L::kStr;
  // attention_bwd_workspace_floats with FERRY_ATTN_BWD_DQ=atomic, and the sizes the GPU test
  // passes: full (0), accumulator + a quarter of the partials (1), the accumulator alone (2).
  const std::int64_t t = sh.t, h = sh.h, d = D;
  const std::int64_t partials = PIN(kBwd, 2 * t * h * d);
  const std::int64_t full = atomic_dq_floats(t, h, d) + partials;
  const std::int64_t acc = atomic_dq_floats(t, h, d);
  const std::int64_t workspace_floats = ws_mode == 0   ? full
                                        : ws_mode == 1 ? acc + (full - acc) / 4
                                                       : acc;
  // launch_bwd_d.
  const std::int64_t rows = sh.t * sh.h;
  const std::int64_t acc_floats = atomic_dq_floats(sh.t, sh.h, D);
  ASSERT_GE(workspace_floats, acc_floats) << what;
  const std::int64_t workspace = 0;
  const std::int64_t dq_acc = workspace;
  const DsumRef dsum = PIN(kBwd, DsumRef{workspace + rows * D, 1, sh.t});
  const std::int64_t part_ws = PIN(kBwd, workspace + acc_floats);
  const std::int64_t part_floats = PIN(kBwd, workspace_floats - acc_floats);
  const std::int64_t group = sh.h / sh.g;
  const std::int64_t per_slice_floats = PIN(kBwd, 2 * sh.t * sh.g * D);
  int slices = 1;
  for (std::int64_t w = group; w > 1; --w) {
    if (PIN(kBwd, group % w == 0 && w * per_slice_floats <= part_floats)) {
      slices = static_cast<int>(w);
      break;
    }
  }
  // The deterministic path given the same (full) workspace: the same slices (dK / dV bits).
  if (ws_mode == 0) {
    int det = 1;
    for (std::int64_t w = group; w > 1; --w)
      if (group % w == 0 && w * per_slice_floats <= workspace_floats) {
        det = static_cast<int>(w);
        break;
      }
    EXPECT_EQ(slices, det) << "slices differ from the deterministic path's: " << what;
  }
  // The partial stores' extent: [part_ws, part_ws + 2 slices T G D) inside the workspace.
  if (slices > 1) {
    EXPECT_GE(part_ws, acc_floats);
    EXPECT_LE(part_ws + 2 * slices * sh.t * sh.g * D, workspace_floats) << what;
  }
  EXPECT_EQ(part_ws % 4, 0) << "partials 16-byte aligned";

  Global mem;
  mem.f.assign(static_cast<std::size_t>(workspace_floats), std::numeric_limits<float>::quiet_NaN());
  // attention_bwd_dsum_kernel: dsum of row (token, head) = 1000 + row here; zeroes the row.
  std::set<std::int64_t> dsum_at;
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t heads = sh.h;
    const std::int64_t p = PIN(kBwd, dsum.at(row / heads, row % heads));
    EXPECT_TRUE(p >= rows * D && p < acc_floats) << "dsum outside its region " << what;
    EXPECT_TRUE(dsum_at.insert(p).second) << "two rows share a dsum slot " << what;
    mem.f[p] = static_cast<float>(1000 + row);
    const std::int64_t z = PIN(kBwd, dq_acc + row * D);
    for (int i = 0; i < D / 4; ++i)
      for (int e = 0; e < 4; ++e) mem.f[z + 4 * i + e] = 0.0f;
  }

  const std::int64_t kv_g = sh.g;
  std::vector<float> kmat(static_cast<std::size_t>(sh.t * kv_g * D));
  for (std::size_t i = 0; i < kmat.size(); ++i) kmat[i] = small_int(31 + i);
  auto dsyn = [&](std::int64_t hh, std::int64_t qtok, std::int64_t ktok) {
    return small_int(((hh * 4096 + qtok) * 4096 + ktok) * 3 + 1);
  };

  g_mem = &mem;
  const int bm = kBK;
  const std::int64_t s = sh.s;
  const std::int64_t grid_x = PIN(kCommon, (t + bm - 1) / bm + s);  // grid_blocks
  for (std::int64_t bx = 0; bx < grid_x; ++bx) {
    SeqBlock sb;
    if (!find_block(cu, sh.s, kBK, bx, &sb)) continue;
    for (std::int64_t by = 0; by < sh.g * slices; ++by) {
      const std::int64_t kvh = by / slices;
      const int slice = static_cast<int>(by % slices);
      const std::int64_t per_slice = group / slices;
      const std::int64_t h_begin = PIN(kBwd, kvh * group + slice * per_slice);
      const std::int64_t s0 = sb.start, len = sb.len, k0 = sb.block * kBK;
      const std::int64_t qstart = PIN(kBwd, sh.causal ? (k0 / BQ) * BQ : 0);
      const std::int64_t qtiles = PIN(kBwd, len > qstart ? (len - qstart + BQ - 1) / BQ : 0);
      const std::int64_t items = per_slice * qtiles;
      Smem sm(L::end);
      for (int r = 0; r < kBK; ++r)  // load_rows_async of K: rows past len zero-filled
        for (int c = 0; c < D; ++c)
          sm.h[L::ks + r * kStr + c] =
              to_bf16(k0 + r < len ? kmat[((s0 + k0 + r) * kv_g + kvh) * D + c] : 0.0f);
      for (std::int64_t it = 0; it < items; ++it) {
        const std::int64_t hh = h_begin + it / qtiles;
        const std::int64_t q0 = PIN(kBwd, qstart + (it % qtiles) * BQ);
        // issue_query_tile's dsum reads: the dsum kernel's value of (token, head).
        for (int i = 0; i < BQ; ++i) {
          const bool valid = q0 + i < len;
          if (!valid) continue;
          const std::int64_t p = dsum.at(s0 + q0 + i, hh);
          pin(kBwd, "dsum.at(s0 + q0 + i, h)");
          ASSERT_EQ(mem.f[p], static_cast<float>(1000 + (s0 + q0 + i) * sh.h + hh)) << what;
        }
        run_item<D, BQ>(sm, dq_acc, hh, q0, k0, s0, len, sh, [&](std::int64_t qi, std::int64_t kj) {
          return dsyn(hh, s0 + qi, s0 + kj);
        });
      }
    }
  }
  g_mem = nullptr;

  // Every (query, key) pair that attention allows, once; nothing else.
  for (std::size_t si = 0; si < lens.size(); ++si) {
    const std::int64_t s0 = cu[si], len = lens[si];
    for (std::int64_t i = 0; i < len; ++i)
      for (std::int64_t hh = 0; hh < H; ++hh) {
        const std::int64_t kvh = hh / (H / G);
        for (int dd = 0; dd < D; ++dd) {
          double want = 0;
          for (std::int64_t j = 0; j < len; ++j)
            if (!causal || j <= i)
              want += double(dsyn(hh, s0 + i, s0 + j)) * kmat[((s0 + j) * G + kvh) * D + dd];
          ASSERT_EQ(mem.f[((s0 + i) * H + hh) * D + dd], want)
              << "dQ token " << s0 + i << " head " << hh << " dim " << dd << " " << what;
        }
      }
  }
  for (std::int64_t p = rows * D; p < workspace_floats; ++p) {
    if (dsum_at.count(p) != 0) {
      const std::int64_t row = [&] {  // the row whose slot p is: p = base + tok + h T
        const std::int64_t off = p - rows * D;
        return (off % sh.t) * sh.h + off / sh.t;
      }();
      ASSERT_EQ(mem.f[p], static_cast<float>(1000 + row)) << "dsum clobbered " << what;
    } else {
      ASSERT_TRUE(std::isnan(mem.f[p])) << "workspace float " << p << " written " << what;
    }
  }
}

TEST(WarpFragmentEmulation, AtomicDqWholeLaunchesCoverEveryPairOnce) {
  for (int mode : {0, 1, 2}) {
    whole_launch<64, 64>({17, 64, 130}, 4, 2, true, mode);
    whole_launch<64, 64>({150}, 4, 1, false, mode);
    whole_launch<128, 32>({5, 129, 77}, 4, 2, true, mode);
    whole_launch<128, 32>({97, 33}, 4, 4, false, mode);
    whole_launch<64, 64>({45, 22}, 3, 1, true, mode);  // T H = 201: dsum padded to 204
  }
  whole_launch<128, 32>({31, 160}, 8, 2, true, 0);
  EXPECT_EQ(ldmatrix_errors, 0);
}

}  // namespace
}  // namespace ferry::kernels
