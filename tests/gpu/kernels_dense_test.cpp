// SPDX-License-Identifier: Apache-2.0
// CUDA backend vs the reference backend (f64) for the dense ops: gemm (+bias), rms_norm (+bwd),
// rope (+bwd), swiglu (+bwd), embedding (+bwd), add, adamw, sum_squares, on swept shapes
// (convert f32 <-> bf16: bit-equal to the CPU backend, special values included)
// (1, primes, non-multiples of tiles, one larger case), with the tolerance rule of style.md
// (gpu_test_util.h). Determinism: rms_norm_backward's d_weight, the embedding backward (f32 and
// bf16 tables) and sum_squares are bitwise repeatable; rms_norm rows do not depend on which other
// rows are in the batch.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/rope_table.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/scoped_env.h"

namespace ferry::testing {
namespace {

using kernels::reference_backend;
constexpr DType kBf = DType::kBF16;
constexpr DType kF64 = DType::kF64;
constexpr DType kF32 = DType::kF32;

class KernelsDense : public CudaTest {};

// The rule's "naive" GEMM: an f32-accumulating loop over q (then + bias, + beta * c0), rounded to
// the output dtype. Row-major a [m, k] ([k, m] when ta), b [k, n] ([n, k] when tb).
HostTensor naive_gemm(const HostTensor& a, const HostTensor& b, const HostTensor* bias,
                      const HostTensor* c0, float beta, std::int64_t m, std::int64_t n,
                      std::int64_t k, bool ta, bool tb, DType out) {
  HostTensor naive({m, n}, kF64);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (std::int64_t q = 0; q < k; ++q)
        acc += static_cast<float>(a.get(ta ? q * m + i : i * k + q)) *
               static_cast<float>(b.get(tb ? j * k + q : q * n + j));
      if (bias != nullptr) acc += static_cast<float>(bias->get(j));
      if (c0 != nullptr) acc += beta * static_cast<float>(c0->get(i * n + j));
      naive.set(i * n + j, out == kBf ? bf16_to_f32(f32_to_bf16(acc)) : acc);
    }
  return naive;
}

TEST_F(KernelsDense, GemmBf16MatchesReference) {
  struct Case {
    std::int64_t m, n, k;
    bool ta, tb, bias;
    DType out;
  };
  const Case cases[] = {
      {1, 1, 1, false, true, false, kBf},        {7, 13, 31, false, true, true, kBf},
      {64, 96, 128, false, false, false, kF32},  {33, 257, 65, true, false, false, kF32},
      {128, 512, 1024, false, true, true, kF32}, {17, 64, 48, true, true, false, kBf}};
  for (const auto& c : cases) {
    const auto a = random_tensor(
        c.ta ? std::vector<std::int64_t>{c.k, c.m} : std::vector<std::int64_t>{c.m, c.k}, kBf,
        1 + c.m);
    const auto b = random_tensor(
        c.tb ? std::vector<std::int64_t>{c.n, c.k} : std::vector<std::int64_t>{c.k, c.n}, kBf,
        2 + c.n);
    const auto bias = random_tensor({c.n}, c.out, 3);
    HostTensor want({c.m, c.n}, kF64);
    const auto a64 = converted(a, kF64), b64 = converted(b, kF64), bias64 = converted(bias, kF64);
    kernels::GemmArgs ra{
        .out = want.view(), .a = a64.cview(), .b = b64.cview(), .trans_a = c.ta, .trans_b = c.tb};
    if (c.bias) ra.bias = bias64.cview();
    FERRY_ASSERT_OK(reference_backend().gemm(ra, mem::Stream::host()));

    DeviceTensor da(a), db(b), dbias(bias), dout(std::vector<std::int64_t>{c.m, c.n}, c.out);
    kernels::GemmArgs ga{
        .out = dout.view(), .a = da.cview(), .b = db.cview(), .trans_a = c.ta, .trans_b = c.tb};
    if (c.bias) ga.bias = dbias.cview();
    FERRY_ASSERT_OK(cuda().gemm(ga, stream()));
    sync();
    const auto got = dout.download();
    const HostTensor naive =
        naive_gemm(a, b, c.bias ? &bias : nullptr, nullptr, 0.0f, c.m, c.n, c.k, c.ta, c.tb, c.out);
    EXPECT_TRUE(within_twice_naive(got, want, naive, 1e-6))
        << "m=" << c.m << " n=" << c.n << " k=" << c.k << " ta=" << c.ta << " tb=" << c.tb;
  }
}

// The GEMM tuner times candidates after writing a scratch of twice the L2, allocated only while
// a shape is tuned (gemm_lt.cpp). With no room for it (a serving arena holding the rest of the
// device) the first GEMM of a new shape still runs (its candidates timed hot), is right, and
// leaves no CUDA error behind.
TEST_F(KernelsDense, GemmTunesWithoutRoomForItsColdL2Scratch) {
  constexpr std::int64_t m = 96, n = 160, k = 224;  // a shape no other test tunes
  const auto a = random_tensor({m, k}, kBf, 41), b = random_tensor({n, k}, kBf, 42);
  DeviceTensor da(a), db(b), dout(std::vector<std::int64_t>{m, n}, kBf);
  {
    // The stream's GEMM workspace comes with its first GEMM: take it before the device is full.
    const auto x = random_tensor({8, 16}, kBf, 43), w = random_tensor({24, 16}, kBf, 44);
    DeviceTensor dx(x), dw(w), dy(std::vector<std::int64_t>{8, 24}, kBf);
    FERRY_ASSERT_OK(cuda().gemm(
        {.out = dy.view(), .a = dx.cview(), .b = dw.cview(), .trans_b = true}, stream()));
    sync();
  }
  int l2 = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), cudaSuccess);
  struct Blockers {
    std::vector<void*> p;
    ~Blockers() {
      for (void* q : p) cudaFree(q);
    }
  } blockers;
  constexpr std::size_t kLeave = 8u << 20;  // less than twice any Hopper L2 (50 MiB)
  std::size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  for (std::size_t chunk = free_b; free_b > kLeave + (1u << 20) && chunk >= (1u << 20);) {
    chunk = std::min(chunk, free_b - kLeave);
    void* q = nullptr;
    if (cudaMalloc(&q, chunk) == cudaSuccess) {
      blockers.p.push_back(q);
    } else {
      (void)cudaGetLastError();
      chunk /= 2;
    }
    ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  }
  if (free_b >= 2 * static_cast<std::size_t>(l2))
    GTEST_SKIP() << "could not fill the device below twice its L2 (" << free_b << " bytes free)";

  FERRY_ASSERT_OK(cuda().gemm(
      {.out = dout.view(), .a = da.cview(), .b = db.cview(), .trans_b = true}, stream()));
  sync();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  for (void* q : std::exchange(blockers.p, {})) cudaFree(q);  // free before the checks below

  HostTensor want({m, n}, kF64);
  const auto a64 = converted(a, kF64), b64 = converted(b, kF64);
  FERRY_ASSERT_OK(reference_backend().gemm(
      {.out = want.view(), .a = a64.cview(), .b = b64.cview(), .trans_b = true},
      mem::Stream::host()));
  const HostTensor naive = naive_gemm(a, b, nullptr, nullptr, 0.0f, m, n, k, false, true, kBf);
  EXPECT_TRUE(within_twice_naive(dout.download(), want, naive, 1e-6));
}

// f32 GEMMs of 1-4 rows against a [n, k] weight (a decode step's linear layers) take the
// small-m kernel (gemm_small_m.cu): within the rule of an f32 loop, and each row's bits are the
// same whether it is computed alone or with the others (what makes a decode step of several
// sequences give each one the bits it gets alone).
TEST_F(KernelsDense, GemmSmallMF32MatchesReferenceAndRowsAreIndependent) {
  struct Case {
    std::int64_t m, n, k;
    bool bias;
    float beta;
  };
  const Case cases[] = {{1, 4096, 2048, false, 0.0f}, {2, 512, 2048, true, 0.0f},
                        {3, 129, 2050, true, 0.0f},   {4, 64, 4096, false, 0.5f},
                        {1, 7, 3, true, 0.0f},        {4, 1000, 768, true, 1.0f}};
  for (const auto& c : cases) {
    const auto a = random_tensor({c.m, c.k}, kF32, 11 + c.m);
    const auto b = random_tensor({c.n, c.k}, kF32, 12 + c.n);
    const auto bias = random_tensor({c.n}, kF32, 13);
    const auto out0 = random_tensor({c.m, c.n}, kF32, 14);  // what beta scales
    HostTensor want = converted(out0, kF64);
    const auto a64 = converted(a, kF64), b64 = converted(b, kF64), bias64 = converted(bias, kF64);
    kernels::GemmArgs ra{.out = want.view(), .a = a64.cview(), .b = b64.cview(), .trans_b = true};
    ra.beta = c.beta;
    if (c.bias) ra.bias = bias64.cview();
    FERRY_ASSERT_OK(reference_backend().gemm(ra, mem::Stream::host()));

    DeviceTensor da(a), db(b), dbias(bias), dout(out0);
    kernels::GemmArgs ga{.out = dout.view(), .a = da.cview(), .b = db.cview(), .trans_b = true};
    ga.beta = c.beta;
    if (c.bias) ga.bias = dbias.cview();
    FERRY_ASSERT_OK(cuda().gemm(ga, stream()));
    sync();
    const auto got = dout.download();
    const HostTensor naive =
        naive_gemm(a, b, c.bias ? &bias : nullptr, &out0, c.beta, c.m, c.n, c.k, false, true, kF32);
    EXPECT_TRUE(within_twice_naive(got, want, naive, 1e-6))
        << "m=" << c.m << " n=" << c.n << " k=" << c.k;
    // Row r alone (m = 1, its own buffers) gives row r's bits of the m-row product.
    for (std::int64_t r = 0; r < c.m; ++r) {
      HostTensor ar({1, c.k}, kF32), o1({1, c.n}, kF32);
      for (std::int64_t q = 0; q < c.k; ++q) ar.set(q, a.get(r * c.k + q));
      for (std::int64_t j = 0; j < c.n; ++j) o1.set(j, out0.get(r * c.n + j));
      DeviceTensor dar(ar), do1(o1);
      kernels::GemmArgs g1{.out = do1.view(), .a = dar.cview(), .b = db.cview(), .trans_b = true};
      g1.beta = c.beta;
      if (c.bias) g1.bias = dbias.cview();
      FERRY_ASSERT_OK(cuda().gemm(g1, stream()));
      sync();
      const auto row = do1.download();
      for (std::int64_t j = 0; j < c.n; ++j) {
        const float x = static_cast<float>(row.get(j));
        const float y = static_cast<float>(got.get(r * c.n + j));
        ASSERT_EQ(std::memcmp(&x, &y, 4), 0)
            << "m=" << c.m << " row " << r << " col " << j << ": " << x << " vs " << y;
      }
    }
  }
}

TEST_F(KernelsDense, RmsNormForwardBackward) {
  for (auto [n, c] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           // 1000: unvectorised; 520 / 2048 / 2600: a warp per row holding 4 (a partial last
           // vector round) / 8 / 16 (partial) vectors per lane; 3072 / 3584 / 3592 / 4096: a
           // 4-warp CTA per row through shared memory, 4 vector slots per thread (3, 3.5, 3.5+1
           // and 4 used; FERRY_RMS_NORM_WARP_ROWS=1 puts them back on the warp kernel with 16);
           // 12288 / 16384 / 40960: a CTA per row with 2, 2 and 5 (of 8) vectors per thread.
           {1, 1},
           {3, 7},
           {17, 129},
           {64, 1000},
           {7, 520},
           {9, 2048},
           {5, 2600},
           {33, 3072},
           {4, 3584},
           {6, 3592},
           {300, 4096},
           {2, 12288},
           {5, 16384},
           {3, 40960}}) {
    const auto x = random_tensor({n, c}, kBf, 10 + n);
    const auto w = random_tensor({c}, kBf, 11 + c, 0.5, 1.5);
    const auto dy = random_tensor({n, c}, kBf, 12 + n);
    const auto x64 = converted(x, kF64), w64 = converted(w, kF64), dy64 = converted(dy, kF64);
    HostTensor want({n, c}, kF64), rstd_ref({n}, kF32), dx_want({n, c}, kF64), dw_want({c}, kF64);
    FERRY_ASSERT_OK(reference_backend().rms_norm({.out = want.view(),
                                                  .rstd = rstd_ref.view(),
                                                  .in = x64.cview(),
                                                  .weight = w64.cview(),
                                                  .eps = 1e-6f},
                                                 mem::Stream::host()));
    FERRY_ASSERT_OK(reference_backend().rms_norm_backward({.d_in = dx_want.view(),
                                                           .d_weight = dw_want.view(),
                                                           .d_out = dy64.cview(),
                                                           .in = x64.cview(),
                                                           .weight = w64.cview(),
                                                           .rstd = rstd_ref.cview()},
                                                          mem::Stream::host()));

    DeviceTensor dx(x), dw(w), ddy(dy), dout(std::vector<std::int64_t>{n, c}, kBf),
        drstd(std::vector<std::int64_t>{n}, kF32);
    DeviceTensor ddx(std::vector<std::int64_t>{n, c}, kBf), ddw(HostTensor({c}, kBf));
    FERRY_ASSERT_OK(cuda().rms_norm({.out = dout.view(),
                                     .rstd = drstd.view(),
                                     .in = dx.cview(),
                                     .weight = dw.cview(),
                                     .eps = 1e-6f},
                                    stream()));
    FERRY_ASSERT_OK(cuda().rms_norm_backward({.d_in = ddx.view(),
                                              .d_weight = ddw.view(),
                                              .d_out = ddy.cview(),
                                              .in = dx.cview(),
                                              .weight = dw.cview(),
                                              .rstd = drstd.cview()},
                                             stream()));
    sync();
    const auto got = dout.download();
    EXPECT_TRUE(within_twice_naive(got, want, rounded_to(want, kBf), 1e-6)) << n << "x" << c;
    EXPECT_TRUE(within_twice_naive(ddx.download(), dx_want, rounded_to(dx_want, kBf), 1e-6))
        << n << "x" << c;
    // d_weight: bf16 output of an n-term f32 sum: naive = f32 loop, rounded.
    EXPECT_TRUE(within_twice_naive(ddw.download(), dw_want, rounded_to(dw_want, kBf), 1e-6 * n))
        << n << "x" << c;
    EXPECT_LE(max_abs_diff(drstd.download(), rstd_ref), 1e-5 * max_abs(rstd_ref) + 1e-6);

    // Determinism: a second backward from zero gives the same bits.
    DeviceTensor ddw2(HostTensor({c}, kBf));
    FERRY_ASSERT_OK(cuda().rms_norm_backward({.d_in = ddx.view(),
                                              .d_weight = ddw2.view(),
                                              .d_out = ddy.cview(),
                                              .in = dx.cview(),
                                              .weight = dw.cview(),
                                              .rstd = drstd.cview()},
                                             stream()));
    sync();
    EXPECT_TRUE(same_bits(ddw.download(), ddw2.download()));
    // Batch invariance: row 0 alone gives the same bits as row 0 in the batch.
    if (n > 1) {
      HostTensor x0({1, c}, kBf);
      std::memcpy(x0.data(), x.data(), static_cast<std::size_t>(c) * 2);
      DeviceTensor dx0(x0), dout0(std::vector<std::int64_t>{1, c}, kBf);
      FERRY_ASSERT_OK(cuda().rms_norm(
          {.out = dout0.view(), .in = dx0.cview(), .weight = dw.cview(), .eps = 1e-6f}, stream()));
      sync();
      EXPECT_EQ(std::memcmp(dout0.download().data(), got.data(), static_cast<std::size_t>(c) * 2),
                0);
    }
  }
}

TEST_F(KernelsDense, RopeForwardBackward) {
  for (auto [t, h, d, rfrac] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, double>>{
           {1, 1, 2, 1.0}, {5, 3, 64, 1.0}, {37, 4, 128, 0.5}, {300, 2, 128, 1.0}}) {
    kernels::RopeScaling sc;
    sc.theta = 1e6;
    sc.partial_rotary_factor = rfrac;
    auto table = kernels::make_rope_table(sc, static_cast<int>(d));
    ASSERT_TRUE(table.ok()) << table.status().to_string();
    const auto r2 = static_cast<std::int64_t>(table->inv_freq.size());
    HostTensor inv({r2}, kF32);
    for (std::int64_t i = 0; i < r2; ++i) inv.set(i, table->inv_freq[static_cast<std::size_t>(i)]);
    HostTensor pos({t}, DType::kI32);
    for (std::int64_t i = 0; i < t; ++i) pos.set(i, static_cast<double>((i * 7919) % 40000));
    for (bool backward : {false, true}) {
      const auto x = random_tensor({t, h, d}, kBf, 20 + t + backward);
      auto want = converted(x, kF64);
      FERRY_ASSERT_OK(reference_backend().rope({.x = want.view(),
                                                .positions = pos.cview(),
                                                .inv_freq = inv.cview(),
                                                .attention_scaling = 1.0f,
                                                .backward = backward},
                                               mem::Stream::host()));
      DeviceTensor dx(x), dpos(pos), dinv(inv);
      FERRY_ASSERT_OK(cuda().rope({.x = dx.view(),
                                   .positions = dpos.cview(),
                                   .inv_freq = dinv.cview(),
                                   .attention_scaling = 1.0f,
                                   .backward = backward},
                                  stream()));
      sync();
      EXPECT_TRUE(within_twice_naive(dx.download(), want, rounded_to(want, kBf), 1e-6))
          << t << " " << h << " " << d;
    }
  }
}

TEST_F(KernelsDense, SwiGluAddForwardBackward) {
  for (auto [n, f] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {3, 11}, {64, 1000}, {129, 4099}}) {
    const auto g = random_tensor({n, f}, kBf, 30 + n, -4, 4),
               u = random_tensor({n, f}, kBf, 31 + f), dy = random_tensor({n, f}, kBf, 32);
    const auto g64 = converted(g, kF64), u64 = converted(u, kF64), dy64 = converted(dy, kF64);
    HostTensor want({n, f}, kF64), dg_want({n, f}, kF64), du_want({n, f}, kF64),
        add_want({n, f}, kF64);
    FERRY_ASSERT_OK(reference_backend().swiglu(
        {.out = want.view(), .gate = g64.cview(), .up = u64.cview()}, mem::Stream::host()));
    FERRY_ASSERT_OK(reference_backend().swiglu_backward({.d_gate = dg_want.view(),
                                                         .d_up = du_want.view(),
                                                         .d_out = dy64.cview(),
                                                         .gate = g64.cview(),
                                                         .up = u64.cview()},
                                                        mem::Stream::host()));
    FERRY_ASSERT_OK(reference_backend().add(
        {.out = add_want.view(), .a = g64.cview(), .b = u64.cview()}, mem::Stream::host()));
    DeviceTensor dg(g), du(u), ddy(dy), dout(std::vector<std::int64_t>{n, f}, kBf),
        ddg(std::vector<std::int64_t>{n, f}, kBf), ddu(std::vector<std::int64_t>{n, f}, kBf),
        dadd(std::vector<std::int64_t>{n, f}, kBf);
    FERRY_ASSERT_OK(
        cuda().swiglu({.out = dout.view(), .gate = dg.cview(), .up = du.cview()}, stream()));
    FERRY_ASSERT_OK(cuda().swiglu_backward({.d_gate = ddg.view(),
                                            .d_up = ddu.view(),
                                            .d_out = ddy.cview(),
                                            .gate = dg.cview(),
                                            .up = du.cview()},
                                           stream()));
    FERRY_ASSERT_OK(cuda().add({.out = dadd.view(), .a = dg.cview(), .b = du.cview()}, stream()));
    sync();
    EXPECT_TRUE(within_twice_naive(dout.download(), want, rounded_to(want, kBf), 1e-6));
    EXPECT_TRUE(within_twice_naive(ddg.download(), dg_want, rounded_to(dg_want, kBf), 1e-6));
    EXPECT_TRUE(within_twice_naive(ddu.download(), du_want, rounded_to(du_want, kBf), 1e-6));
    EXPECT_TRUE(within_twice_naive(dadd.download(), add_want, rounded_to(add_want, kBf), 1e-6));
  }
}

// SwiGluArgs::out16 on an f32 SwiGLU (ModelCompute's GEMM input reuse): out is the same bits as
// the plain f32 kernel's, and out16 is convert(out) bit for bit, over aligned shapes (the vector
// path), odd ones (the scalar tail) and an offset view (misaligned: the scalar loop only); also
// an overflow to +inf. A wrong out16 (shape, dtype, bf16 gate) is refused.
TEST_F(KernelsDense, SwiGluBf16CopyIsConvertOfTheOutput) {
  for (auto [n, f] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 1}, {3, 11}, {64, 1000}, {129, 4099}, {16, 18944}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " f=" << f);
    auto g = random_tensor({n, f}, kF32, 60 + n, -8, 8);
    auto u = random_tensor({n, f}, kF32, 61 + f, -2, 2);
    if (n * f > 2) {
      g.set(0, 100.0);
      u.set(0, 3.0e38);  // overflows to +inf
    }
    DeviceTensor dg(g), du(u), plain(std::vector<std::int64_t>{n, f}, kF32),
        out(std::vector<std::int64_t>{n, f}, kF32), out16(std::vector<std::int64_t>{n, f}, kBf),
        want16(std::vector<std::int64_t>{n, f}, kBf);
    FERRY_ASSERT_OK(
        cuda().swiglu({.out = plain.view(), .gate = dg.cview(), .up = du.cview()}, stream()));
    FERRY_ASSERT_OK(cuda().swiglu(
        {.out = out.view(), .gate = dg.cview(), .up = du.cview(), .out16 = out16.view()},
        stream()));
    FERRY_ASSERT_OK(cuda().convert({.out = want16.view(), .in = out.cview()}, stream()));
    sync();
    const HostTensor p = plain.download(), o = out.download(), o16 = out16.download(),
                     w16 = want16.download();
    const auto count = static_cast<std::size_t>(n * f);
    EXPECT_EQ(std::memcmp(o.data(), p.data(), count * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(o16.data(), w16.data(), count * sizeof(std::uint16_t)), 0);
    // Offset by one element: no 16-byte alignment, the scalar loop.
    if (n * f > 4) {
      const std::int64_t m = n * f - 1;
      auto shifted = [&](const DeviceTensor& t) {
        TensorView v = t.view();
        v.data = static_cast<std::byte*>(v.data) + dtype_size(v.dtype);
        v.ndim = 2;
        v.shape[0] = 1;
        v.shape[1] = m;
        v.stride[0] = m;
        v.stride[1] = 1;
        return v;
      };
      DeviceTensor out_b(std::vector<std::int64_t>{n, f}, kF32),
          out16_b(std::vector<std::int64_t>{n, f}, kBf);
      FERRY_ASSERT_OK(cuda().swiglu({.out = shifted(out_b),
                                     .gate = shifted(dg),
                                     .up = shifted(du),
                                     .out16 = shifted(out16_b)},
                                    stream()));
      sync();
      const HostTensor ob = out_b.download(), ob16 = out16_b.download();
      EXPECT_EQ(std::memcmp(static_cast<const float*>(ob.data()) + 1,
                            static_cast<const float*>(p.data()) + 1, std::size_t(m) * 4),
                0);
      EXPECT_EQ(std::memcmp(static_cast<const std::uint16_t*>(ob16.data()) + 1,
                            static_cast<const std::uint16_t*>(w16.data()) + 1, std::size_t(m) * 2),
                0);
    }
  }
  const auto g = random_tensor({2, 3}, kF32, 1), u = random_tensor({2, 3}, kF32, 2);
  DeviceTensor dg(g), du(u), out(std::vector<std::int64_t>{2, 3}, kF32),
      bad_shape(std::vector<std::int64_t>{3, 2}, kBf),
      bad_dtype(std::vector<std::int64_t>{2, 3}, kF32);
  for (const DeviceTensor* bad : {&bad_shape, &bad_dtype}) {
    EXPECT_FALSE(
        cuda()
            .swiglu({.out = out.view(), .gate = dg.cview(), .up = du.cview(), .out16 = bad->view()},
                    stream())
            .ok());
  }
  DeviceTensor gb(converted(g, kBf)), ub(converted(u, kBf)),
      ob(std::vector<std::int64_t>{2, 3}, kBf), o16(std::vector<std::int64_t>{2, 3}, kBf);
  EXPECT_FALSE(
      cuda()
          .swiglu({.out = ob.view(), .gate = gb.cview(), .up = ub.cview(), .out16 = o16.view()},
                  stream())
          .ok());
}

// RmsNormArgs::out16 on an f32 norm (ModelCompute's GEMM input reuse): out and rstd are the bits
// of the plain f32 kernel, and out16 is convert(out) bit for bit, over widths that reach every f32
// kernel of launch_rms_norm (one warp per row with 2/8/16 vectors per lane, one CTA per row with
// 1/2 vectors per thread (3584: the 7B width), the strided vector kernel, the scalar kernel),
// and an out16 view offset by one element (the copy's scalar stores, out still vectorized); also
// overflow to +-inf. A wrong out16 (shape, dtype, bf16 input) is refused.
TEST_F(KernelsDense, RmsNormBf16CopyIsConvertOfTheOutput) {
  for (auto [n, c] : std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 1},
                                                                        {3, 7},
                                                                        {5, 128},
                                                                        {9, 256},
                                                                        {33, 1024},
                                                                        {17, 2048},
                                                                        {64, 3584},
                                                                        {6, 8192},
                                                                        {3, 1031},
                                                                        {2, 40000}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " c=" << c);
    const auto x = random_tensor({n, c}, kF32, 70 + n, -4, 4);
    auto w = random_tensor({c}, kF32, 71 + c, -2, 2);
    if (c > 2) {
      w.set(0, 3.0e38);  // overflows to +-inf where |x r| > 1
      w.set(1, 1.0e-30);
    }
    DeviceTensor dx(x), dw(w), plain(std::vector<std::int64_t>{n, c}, kF32),
        out(std::vector<std::int64_t>{n, c}, kF32), rstd_plain(std::vector<std::int64_t>{n}, kF32),
        rstd(std::vector<std::int64_t>{n}, kF32), out16(std::vector<std::int64_t>{n, c}, kBf),
        want16(std::vector<std::int64_t>{n, c}, kBf), out_b(std::vector<std::int64_t>{n, c}, kF32),
        out16_b(std::vector<std::int64_t>{n * c + 1}, kBf);
    FERRY_ASSERT_OK(cuda().rms_norm({.out = plain.view(),
                                     .rstd = rstd_plain.view(),
                                     .in = dx.cview(),
                                     .weight = dw.cview(),
                                     .eps = 1e-6f},
                                    stream()));
    FERRY_ASSERT_OK(cuda().rms_norm({.out = out.view(),
                                     .rstd = rstd.view(),
                                     .in = dx.cview(),
                                     .weight = dw.cview(),
                                     .eps = 1e-6f,
                                     .out16 = out16.view()},
                                    stream()));
    FERRY_ASSERT_OK(cuda().convert({.out = want16.view(), .in = out.cview()}, stream()));
    // The copy one bf16 element into its buffer: 2-byte aligned only.
    TensorView shifted16 = out16_b.view();
    shifted16.data = static_cast<std::byte*>(shifted16.data) + sizeof(std::uint16_t);
    shifted16.ndim = 2;
    shifted16.shape[0] = n;
    shifted16.shape[1] = c;
    shifted16.stride[0] = c;
    shifted16.stride[1] = 1;
    FERRY_ASSERT_OK(cuda().rms_norm({.out = out_b.view(),
                                     .in = dx.cview(),
                                     .weight = dw.cview(),
                                     .eps = 1e-6f,
                                     .out16 = shifted16},
                                    stream()));
    sync();
    const HostTensor p = plain.download(), o = out.download(), rp = rstd_plain.download(),
                     r = rstd.download(), o16 = out16.download(), w16 = want16.download(),
                     ob = out_b.download(), ob16 = out16_b.download();
    const auto count = static_cast<std::size_t>(n * c);
    EXPECT_EQ(std::memcmp(o.data(), p.data(), count * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(r.data(), rp.data(), static_cast<std::size_t>(n) * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(o16.data(), w16.data(), count * sizeof(std::uint16_t)), 0);
    EXPECT_EQ(std::memcmp(ob.data(), p.data(), count * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(static_cast<const std::uint16_t*>(ob16.data()) + 1, w16.data(),
                          count * sizeof(std::uint16_t)),
              0);
  }
  const auto x = random_tensor({2, 4}, kF32, 1), w = random_tensor({4}, kF32, 2);
  DeviceTensor dx(x), dw(w), out(std::vector<std::int64_t>{2, 4}, kF32),
      bad_shape(std::vector<std::int64_t>{4, 2}, kBf),
      bad_dtype(std::vector<std::int64_t>{2, 4}, kF32);
  for (const DeviceTensor* bad : {&bad_shape, &bad_dtype}) {
    EXPECT_FALSE(
        cuda()
            .rms_norm(
                {.out = out.view(), .in = dx.cview(), .weight = dw.cview(), .out16 = bad->view()},
                stream())
            .ok());
  }
  DeviceTensor xb(converted(x, kBf)), wb(converted(w, kBf)),
      ob(std::vector<std::int64_t>{2, 4}, kBf), o16(std::vector<std::int64_t>{2, 4}, kBf);
  EXPECT_FALSE(
      cuda()
          .rms_norm({.out = ob.view(), .in = xb.cview(), .weight = wb.cview(), .out16 = o16.view()},
                    stream())
          .ok());
}

TEST_F(KernelsDense, EmbeddingForwardBackward) {
  for (auto [t, v, c] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
           {1, 1, 1}, {13, 7, 33}, {500, 97, 256}}) {
    const auto table = random_tensor({v, c}, kBf, 40 + v);
    const auto ids = random_ids(t, v, 41 + t);
    const auto dy = random_tensor({t, c}, kBf, 42);
    const auto table64 = converted(table, kF64), dy64 = converted(dy, kF64);
    HostTensor want({t, c}, kF64), dt_want({v, c}, kF64);
    FERRY_ASSERT_OK(reference_backend().embedding(
        {.out = want.view(), .table = table64.cview(), .ids = ids.cview()}, mem::Stream::host()));
    FERRY_ASSERT_OK(reference_backend().embedding_backward(
        {.d_table = dt_want.view(), .d_out = dy64.cview(), .ids = ids.cview()},
        mem::Stream::host()));
    DeviceTensor dtab(table), dids(ids), ddy(dy), dout(std::vector<std::int64_t>{t, c}, kBf);
    DeviceTensor dtab_f32(HostTensor({v, c}, kF32)), dtab_f32b(HostTensor({v, c}, kF32)),
        dtab_bf(HostTensor({v, c}, kBf)), dtab_bf2(HostTensor({v, c}, kBf));
    FERRY_ASSERT_OK(cuda().embedding(
        {.out = dout.view(), .table = dtab.cview(), .ids = dids.cview()}, stream()));
    FERRY_ASSERT_OK(cuda().embedding_backward(
        {.d_table = dtab_f32.view(), .d_out = ddy.cview(), .ids = dids.cview()}, stream()));
    FERRY_ASSERT_OK(cuda().embedding_backward(
        {.d_table = dtab_f32b.view(), .d_out = ddy.cview(), .ids = dids.cview()}, stream()));
    FERRY_ASSERT_OK(cuda().embedding_backward(
        {.d_table = dtab_bf.view(), .d_out = ddy.cview(), .ids = dids.cview()}, stream()));
    FERRY_ASSERT_OK(cuda().embedding_backward(
        {.d_table = dtab_bf2.view(), .d_out = ddy.cview(), .ids = dids.cview()}, stream()));
    sync();
    EXPECT_TRUE(same_bits(dout.download(), converted(want, kBf)));
    // f32 table: t-term f32 sums; naive = f32 rounding of each step, bounded by t * eps32 * max.
    EXPECT_LE(max_abs_diff(dtab_f32.download(), dt_want), 1e-6 * static_cast<double>(t) + 1e-6);
    // bf16 table: rounds after every accumulated token, like a naive bf16 loop does.
    HostTensor naive({v, c}, kBf);
    for (std::int64_t i = 0; i < t; ++i)
      for (std::int64_t j = 0; j < c; ++j) {
        const std::int64_t at = static_cast<std::int64_t>(ids.get(i)) * c + j;
        naive.set(at, naive.get(at) + dy.get(i * c + j));
      }
    EXPECT_TRUE(within_twice_naive(dtab_bf.download(), dt_want, naive, 1e-6));
    EXPECT_TRUE(same_bits(dtab_bf.download(), dtab_bf2.download()));
    // Both backwards are deterministic: repeated ids add in token order every time.
    EXPECT_TRUE(same_bits(dtab_f32.download(), dtab_f32b.download()));
  }
}

// Every embedding backward kernel against the column kernel (FERRY_EMBEDDING_BWD=column) bit for
// bit: the vocabulary-sliced one (the default) and the compact one (=compact). Random ids with
// heavy repeats (a quarter of the tokens on 3 ids, ids sharing a slice; one case of long runs of a
// single id, so the compact walk's groups repeat ids) and out-of-range ids, more tokens than one
// staged chunk, a slice count at its cap, widths not a multiple of the CTA, a nonzero d_table
// accumulated into, f32 and bf16 tables and d_out.
TEST_F(KernelsDense, EmbeddingBackwardKernelsAreTheColumnKernelBitForBit) {
  for (auto [t, v, c] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{{1, 1, 1},
                                                                         {5000, 1000, 200},
                                                                         {4500, 70, 33},
                                                                         {300, 152064, 64},
                                                                         {40000, 152064, 40},
                                                                         {3000, 5, 130}}) {
    SCOPED_TRACE(::testing::Message() << "t=" << t << " v=" << v << " c=" << c);
    HostTensor ids = random_ids(t, v, 90 + t);
    for (std::int64_t i = 0; i < t; i += 4) ids.set(i, static_cast<double>((i / 4) % 3 * 32 % v));
    if (t == 3000) {  // runs of one id: 16 tokens on id 2, then 16 random ones, ...
      for (std::int64_t i = 0; i < t; ++i)
        if ((i / 16) % 2 == 0) ids.set(i, 2.0);
    }
    if (t > 10) {
      ids.set(3, -1.0);
      ids.set(7, static_cast<double>(v));
    }
    DeviceTensor dids(ids);
    for (auto [dt_table, dt_out] :
         std::vector<std::pair<DType, DType>>{{kF32, kF32}, {kF32, kBf}, {kBf, kBf}, {kBf, kF32}}) {
      const auto dy = random_tensor({t, c}, dt_out, 91 + c, -1, 1);
      const auto init = random_tensor({v, c}, dt_table, 92 + v, -1, 1);
      DeviceTensor ddy(dy), column(init);
      {
        const ferry::testing::ScopedEnv env("FERRY_EMBEDDING_BWD", "column");
        FERRY_ASSERT_OK(cuda().embedding_backward(
            {.d_table = column.view(), .d_out = ddy.cview(), .ids = dids.cview()}, stream()));
        sync();
      }
      const HostTensor want = column.download();
      for (const char* kernel : {"sliced", "compact"}) {
        DeviceTensor got(init);
        const ferry::testing::ScopedEnv env("FERRY_EMBEDDING_BWD", kernel);
        FERRY_ASSERT_OK(cuda().embedding_backward(
            {.d_table = got.view(), .d_out = ddy.cview(), .ids = dids.cview()}, stream()));
        sync();
        EXPECT_TRUE(same_bits(got.download(), want))
            << kernel << ": " << to_string(dt_table) << " table, " << to_string(dt_out) << " d_out";
      }
    }
  }
}

// The vector forward (16-byte rows, the default where sizes and alignment allow) against the
// element kernel (FERRY_EMBEDDING_FWD=element) and the ids' rows on the host, bit for bit: widths
// that take the vector path (bf16 C % 8 == 0, f32 C % 4 == 0; rows of fewer than one warp's and
// more than four warps' vectors) and widths and a table base that do not (the fallback), tokens
// not a multiple of the CTA's 8, out-of-range ids (zero rows).
TEST_F(KernelsDense, EmbeddingForwardVectorRowsAreTheElementKernelBitForBit) {
  for (auto [t, v, c] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
           {1, 1, 8}, {13, 7, 33}, {61, 97, 256}, {203, 1000, 2048}, {9, 50, 4}, {17, 30, 3584}}) {
    for (const DType dt : {kBf, kF32}) {
      SCOPED_TRACE(::testing::Message()
                   << "t=" << t << " v=" << v << " c=" << c << " " << to_string(dt));
      HostTensor ids = random_ids(t, v, 70 + t);
      if (t > 8) {
        ids.set(2, -5.0);
        ids.set(8, static_cast<double>(v));
      }
      // One spare row in front: the view at element 1 is the misaligned-table case.
      const auto table = random_tensor({v + 1, c}, dt, 71 + c, -1, 1);
      DeviceTensor dtab(table), dids(ids);
      TensorView whole = dtab.view();
      whole.shape[0] = v;
      TensorView shifted = whole;
      shifted.data = static_cast<char*>(shifted.data) + dtype_size(dt);
      for (const TensorView& tab : {whole, shifted}) {
        DeviceTensor vec(std::vector<std::int64_t>{t, c}, dt),
            elem(std::vector<std::int64_t>{t, c}, dt);
        {
          const ferry::testing::ScopedEnv env("FERRY_EMBEDDING_FWD", nullptr);
          FERRY_ASSERT_OK(cuda().embedding(
              {.out = vec.view(), .table = ConstTensorView(tab), .ids = dids.cview()}, stream()));
        }
        {
          const ferry::testing::ScopedEnv env("FERRY_EMBEDDING_FWD", "element");
          FERRY_ASSERT_OK(cuda().embedding(
              {.out = elem.view(), .table = ConstTensorView(tab), .ids = dids.cview()}, stream()));
        }
        sync();
        const HostTensor got = vec.download();
        EXPECT_TRUE(same_bits(got, elem.download()));
        // The host's rows: table row id (+1 element for the shifted view), zeros out of range.
        const std::int64_t shift = tab.data == whole.data ? 0 : 1;
        bool rows_ok = true;
        for (std::int64_t i = 0; i < t && rows_ok; ++i) {
          const auto id = static_cast<std::int64_t>(ids.get(i));
          for (std::int64_t j = 0; j < c; ++j) {
            const double want = id < 0 || id >= v ? 0.0 : table.get(id * c + j + shift);
            if (got.get(i * c + j) != want) {
              rows_ok = false;
              break;
            }
          }
        }
        EXPECT_TRUE(rows_ok) << (shift != 0 ? "shifted table" : "aligned table");
      }
    }
  }
}

TEST_F(KernelsDense, AdamWAndSumSquares) {
  for (std::int64_t n : {1, 7, 1000, 100003}) {
    auto p = random_tensor({n}, kF32, 50 + n), m = random_tensor({n}, kF32, 51, -0.1, 0.1),
         v = random_tensor({n}, kF32, 52, 0.0, 0.01);
    const auto grad = random_tensor({n}, kF32, 53);
    DeviceTensor dp(p), dm(m), dv(v), dg(grad), dbf(std::vector<std::int64_t>{n}, kBf);
    const kernels::AdamWArgs base{.lr = 1e-3f,
                                  .beta1 = 0.9f,
                                  .beta2 = 0.95f,
                                  .eps = 1e-8f,
                                  .weight_decay = 0.1f,
                                  .grad_scale = 0.5f,
                                  .step = 3};
    auto ra = base;
    ra.param = p.view();
    ra.m = m.view();
    ra.v = v.view();
    ra.grad = grad.cview();
    FERRY_ASSERT_OK(reference_backend().adamw(ra, mem::Stream::host()));
    auto ca = base;
    ca.param = dp.view();
    ca.m = dm.view();
    ca.v = dv.view();
    ca.grad = dg.cview();
    ca.param_bf16 = dbf.view();
    FERRY_ASSERT_OK(cuda().adamw(ca, stream()));
    HostTensor ss_want({1}, kF32);
    FERRY_ASSERT_OK(reference_backend().sum_squares({.out = ss_want.view(), .x = grad.cview()},
                                                    mem::Stream::host()));
    DeviceTensor dss(std::vector<std::int64_t>{1}, kF32), dss2(std::vector<std::int64_t>{1}, kF32);
    FERRY_ASSERT_OK(cuda().sum_squares({.out = dss.view(), .x = dg.cview()}, stream()));
    FERRY_ASSERT_OK(cuda().sum_squares({.out = dss2.view(), .x = dg.cview()}, stream()));
    sync();
    EXPECT_TRUE(same_bits(dss.download(), dss2.download())) << "sum_squares is deterministic";
    // f32 elementwise: a few f32 roundings per element.
    EXPECT_LE(max_abs_diff(dp.download(), p), 4e-7 * (max_abs(p) + 1.0));
    EXPECT_LE(max_abs_diff(dm.download(), m), 4e-7 * (max_abs(m) + 1e-3));
    EXPECT_LE(max_abs_diff(dv.download(), v), 4e-7 * (max_abs(v) + 1e-6));
    EXPECT_TRUE(same_bits(dbf.download(), converted(dp.download(), kBf)));
    EXPECT_LE(std::fabs(dss.download().get(0) - ss_want.get(0)), 1e-5 * ss_want.get(0) + 1e-6);
  }
}

// The grid path of sum_squares (a workspace given): deterministic, within f32 accumulation of the
// f64 reference at sizes from one slice to many, and a short workspace is refused.
TEST_F(KernelsDense, SumSquaresGridIsDeterministicAndAccurate) {
  const std::size_t ws_bytes = cuda().workspace_bytes(kernels::SumSquaresArgs{});
  ASSERT_GT(ws_bytes, 0u);
  DeviceTensor ws(std::vector<std::int64_t>{static_cast<std::int64_t>(ws_bytes)}, DType::kU8);
  for (std::int64_t n : {std::int64_t{100}, (std::int64_t{1} << 16) + 3, std::int64_t{5000017}}) {
    const HostTensor x = random_tensor({n}, kF32, static_cast<std::uint64_t>(n), -2.0, 2.0);
    const DeviceTensor dx(x);
    HostTensor want({1}, kF32);
    FERRY_ASSERT_OK(
        reference_backend().sum_squares({.out = want.view(), .x = x.cview()}, mem::Stream::host()));
    DeviceTensor a(std::vector<std::int64_t>{1}, kF32), b(std::vector<std::int64_t>{1}, kF32);
    FERRY_ASSERT_OK(
        cuda().sum_squares({.out = a.view(), .x = dx.cview(), .workspace = ws.view()}, stream()));
    FERRY_ASSERT_OK(
        cuda().sum_squares({.out = b.view(), .x = dx.cview(), .workspace = ws.view()}, stream()));
    sync();
    EXPECT_TRUE(same_bits(a.download(), b.download())) << n;
    // f32 accumulation over n terms (sequential within a thread's chain): n * 2^-24 relative.
    const double w = want.get(0);
    EXPECT_LE(std::fabs(a.download().get(0) - w), 1e-5 * w) << n;
  }
  const DeviceTensor dx(random_tensor({1 << 20}, kF32, 3, -1.0, 1.0));
  DeviceTensor out(std::vector<std::int64_t>{1}, kF32);
  TensorView short_ws = ws.view();
  short_ws.shape[0] = 8;
  EXPECT_EQ(cuda()
                .sum_squares({.out = out.view(), .x = dx.cview(), .workspace = short_ws}, stream())
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_F(KernelsDense, ConvertMatchesCpuBitForBit) {
  // Rounding is exact arithmetic (round to nearest even), so CUDA must equal the CPU bit for bit.
  for (std::int64_t n : {1, 7, 33, 4099, 1 << 20}) {
    HostTensor x = random_tensor({n}, kF32, static_cast<std::uint64_t>(n) + 5, -1e3, 1e3);
    auto* p = static_cast<float*>(x.data());
    for (std::int64_t i = 0; i < n; i += 3) p[i] *= std::ldexp(1.0f, static_cast<int>(i % 60) - 30);
    // Specials: halfway ties, a carry into the exponent, overflow to inf, signed zero, subnormal.
    const std::uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x3fff8000u, 0x7f7fffffu,
                                      0x80000000u, 0x00018000u, 0x7f800000u};
    for (std::size_t j = 0; j < std::size(specials) && static_cast<std::int64_t>(j) < n; ++j)
      std::memcpy(p + j, &specials[j], 4);
    HostTensor want({n}, kBf), back_want({n}, kF32);
    FERRY_ASSERT_OK(
        kernels::cpu_backend().convert({.out = want.view(), .in = x.cview()}, mem::Stream::host()));
    FERRY_ASSERT_OK(kernels::cpu_backend().convert({.out = back_want.view(), .in = want.cview()},
                                                   mem::Stream::host()));
    DeviceTensor dx(x), dy(std::vector<std::int64_t>{n}, kBf),
        dback(std::vector<std::int64_t>{n}, kF32);
    FERRY_ASSERT_OK(cuda().convert({.out = dy.view(), .in = dx.cview()}, stream()));
    FERRY_ASSERT_OK(cuda().convert({.out = dback.view(), .in = dy.cview()}, stream()));
    sync();
    EXPECT_TRUE(same_bits(dy.download(), want)) << "f32 -> bf16, n=" << n;
    EXPECT_TRUE(same_bits(dback.download(), back_want)) << "bf16 -> f32, n=" << n;
  }
  DeviceTensor a(std::vector<std::int64_t>{4}, kF32), b(std::vector<std::int64_t>{3}, kBf);
  EXPECT_EQ(cuda().convert({.out = b.view(), .in = a.cview()}, stream()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda().convert({.out = b.view(), .in = a.cview()}, mem::Stream::host()).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(KernelsDense, RejectsBadArguments) {
  DeviceTensor x(std::vector<std::int64_t>{4, 8}, kBf), w(std::vector<std::int64_t>{7}, kBf),
      y(std::vector<std::int64_t>{4, 8}, kBf);
  auto s = cuda().rms_norm({.out = y.view(), .in = x.cview(), .weight = w.cview()}, stream());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  HostTensor hx({4, 8}, kBf);
  s = cuda().rms_norm({.out = y.view(), .in = hx.cview(), .weight = w.cview()}, stream());
  EXPECT_FALSE(s.ok());
  s = cuda().rms_norm({.out = y.view(), .in = x.cview(), .weight = w.cview()}, mem::Stream::host());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::testing
