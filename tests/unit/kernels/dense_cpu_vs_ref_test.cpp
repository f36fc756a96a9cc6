// SPDX-License-Identifier: Apache-2.0
// CPU backend vs the reference backend for the dense ops, over swept shapes (1, primes,
// non-multiples of the 8/16-float SIMD widths, one larger case that also splits across threads).
// The reference runs in f64 on the f64 images of the same f32 inputs, so the only difference is
// the CPU's f32 arithmetic. Tolerances are per element, derived from counting f32 roundings
// (u = 2^-24, one rounding = relative error <= u) in the CPU's evaluation order; each bound
// states its derivation. Error paths (unsupported dtype, non-contiguous view, bad id, shape
// mismatch) are checked to return the documented Status codes.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "unit/kernels/kernel_test_util.h"

namespace ferry::kernels {
namespace {

using testing::converted;
using testing::HostTensor;
using testing::random_tensor;
using testing::zeros;

constexpr double kU = 0x1p-24;  // f32 unit roundoff

Stream& host() { return Stream::host(); }
Backend& ref() { return reference_backend(); }
Backend& cpu() { return cpu_backend(); }
HostTensor f64(const HostTensor& t) { return converted(t, DType::kF64); }

// Every element within its own bound; reports the worst violation.
::testing::AssertionResult within_bounds(const HostTensor& got, const HostTensor& want,
                                         const std::vector<double>& bound) {
  std::int64_t bad = 0, worst = -1;
  double worst_ratio = 0.0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double err = std::fabs(got.get(i) - want.get(i));
    const double b = bound[static_cast<std::size_t>(i)];
    if (!(err <= b)) {
      ++bad;
      const double ratio = std::isnan(err) ? INFINITY : err / std::max(b, 1e-300);
      if (worst < 0 || ratio > worst_ratio) worst = i, worst_ratio = ratio;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.numel() << " out of bound; worst at " << worst << ": got "
         << got.get(worst) << " want " << want.get(worst) << " bound "
         << bound[static_cast<std::size_t>(worst)] << " (err/bound " << worst_ratio << ")";
}

const std::int64_t kSizes[] = {1, 7, 13, 17, 33, 97, 129};

// ---------------------------------------------------------------- gemm

struct GemmCase {
  std::int64_t m, n, k;
  bool ta, tb, bias;
  float alpha, beta;
};

void run_gemm_case(const GemmCase& g, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message()
               << "m=" << g.m << " n=" << g.n << " k=" << g.k << " ta=" << g.ta << " tb=" << g.tb
               << " bias=" << g.bias << " alpha=" << g.alpha << " beta=" << g.beta);
  const HostTensor a = random_tensor(
      g.ta ? std::vector<std::int64_t>{g.k, g.m} : std::vector<std::int64_t>{g.m, g.k}, DType::kF32,
      seed);
  const HostTensor b = random_tensor(
      g.tb ? std::vector<std::int64_t>{g.n, g.k} : std::vector<std::int64_t>{g.k, g.n}, DType::kF32,
      seed + 1);
  const HostTensor bias = random_tensor({g.n}, DType::kF32, seed + 2);
  const HostTensor c0 = random_tensor({g.m, g.n}, DType::kF32, seed + 3);
  HostTensor got = c0;
  HostTensor want = f64(c0);
  const HostTensor a64 = f64(a), b64 = f64(b), bias64 = f64(bias);
  GemmArgs args{.trans_a = g.ta, .trans_b = g.tb, .alpha = g.alpha, .beta = g.beta};
  args.out = got.view(), args.a = a.cview(), args.b = b.cview();
  if (g.bias) args.bias = bias.cview();
  FERRY_ASSERT_OK(cpu().gemm(args, host()));
  args.out = want.view(), args.a = a64.cview(), args.b = b64.cview();
  if (g.bias) args.bias = bias64.cview();
  FERRY_ASSERT_OK(ref().gemm(args, host()));
  // Classical dot-product bound |fl(sum a b) - sum a b| <= gamma_K sum |a b| (gamma_K ~ K u;
  // blocked and FMA orders satisfy it too), then alpha scaling, beta scaling, the add and the
  // bias add cost one rounding each: bound = (K + 4) u (|alpha| S + |beta c0| + |bias|).
  std::vector<double> bound(static_cast<std::size_t>(g.m * g.n));
  for (std::int64_t i = 0; i < g.m; ++i) {
    for (std::int64_t j = 0; j < g.n; ++j) {
      double s = 0.0;
      for (std::int64_t p = 0; p < g.k; ++p) {
        const double av = g.ta ? a.get(p * g.m + i) : a.get(i * g.k + p);
        const double bv = g.tb ? b.get(j * g.k + p) : b.get(p * g.n + j);
        s += std::fabs(av * bv);
      }
      const double rest =
          std::fabs(g.beta * c0.get(i * g.n + j)) + (g.bias ? std::fabs(bias.get(j)) : 0.0);
      bound[static_cast<std::size_t>(i * g.n + j)] =
          static_cast<double>(g.k + 4) * kU * (std::fabs(g.alpha) * s + rest);
    }
  }
  EXPECT_TRUE(within_bounds(got, want, bound));
}

TEST(DenseCpuVsRef, GemmSweep) {
  std::uint64_t seed = 100;
  for (std::int64_t m : {1, 7, 17}) {
    for (std::int64_t n : {1, 13, 33}) {
      for (std::int64_t k : {1, 7, 97}) {
        for (int flags = 0; flags < 4; ++flags) {
          run_gemm_case({m, n, k, (flags & 1) != 0, (flags & 2) != 0, flags == 3, 1.0f, 0.0f},
                        seed++);
        }
      }
    }
  }
}

TEST(DenseCpuVsRef, GemmAlphaBetaBiasAndLargeCase) {
  run_gemm_case({13, 17, 33, false, true, true, 0.5f, 1.0f}, 7);
  run_gemm_case({13, 17, 33, true, false, false, -2.0f, 0.25f}, 8);
  run_gemm_case({7, 5, 0, false, true, true, 1.0f, 0.5f}, 9);  // K = 0: out = beta out + bias
  run_gemm_case({64, 96, 129, false, true, true, 1.0f, 0.0f}, 10);
}

TEST(DenseCpuVsRef, GemmBetaZeroIgnoresNanInOut) {
  const HostTensor a = random_tensor({3, 4}, DType::kF32, 1),
                   b = random_tensor({4, 5}, DType::kF32, 2);
  for (bool with_bias : {false, true}) {
    HostTensor out = zeros({3, 5}, DType::kF32);
    out.fill(std::numeric_limits<double>::quiet_NaN());
    const HostTensor bias = random_tensor({5}, DType::kF32, 3);
    GemmArgs args{.out = out.view(), .a = a.cview(), .b = b.cview()};
    if (with_bias) args.bias = bias.cview();
    FERRY_ASSERT_OK(cpu().gemm(args, host()));
    for (std::int64_t i = 0; i < out.numel(); ++i) EXPECT_FALSE(std::isnan(out.get(i))) << i;
  }
}

// ---------------------------------------------------------------- embedding

TEST(DenseCpuVsRef, EmbeddingForwardIsExactCopyAndBackwardSumsRepeats) {
  for (std::int64_t c : kSizes) {
    SCOPED_TRACE(::testing::Message() << "c=" << c);
    const std::int64_t v = 11, t_count = 97;
    const HostTensor table = random_tensor({v, c}, DType::kF32, 20 + c);
    const HostTensor ids = testing::random_ids(t_count, v, 30 + c);  // 97 ids over 11: repeats
    HostTensor out = zeros({t_count, c}, DType::kF32);
    FERRY_ASSERT_OK(
        cpu().embedding({.out = out.view(), .table = table.cview(), .ids = ids.cview()}, host()));
    for (std::int64_t t = 0; t < t_count; ++t)
      for (std::int64_t j = 0; j < c; ++j)
        ASSERT_EQ(out.get(t * c + j), table.get(static_cast<std::int64_t>(ids.get(t)) * c + j));

    const HostTensor d_out = random_tensor({t_count, c}, DType::kF32, 40 + c);
    const HostTensor d0 = random_tensor({v, c}, DType::kF32, 50 + c);
    HostTensor got = d0, want = f64(d0);
    const HostTensor d_out64 = f64(d_out);
    FERRY_ASSERT_OK(cpu().embedding_backward(
        {.d_table = got.view(), .d_out = d_out.cview(), .ids = ids.cview()}, host()));
    FERRY_ASSERT_OK(ref().embedding_backward(
        {.d_table = want.view(), .d_out = d_out64.cview(), .ids = ids.cview()}, host()));
    // Row r receives n_r f32 additions, each one rounding: bound = n_r u (|d0| + sum |d_out|).
    std::vector<double> bound(static_cast<std::size_t>(v * c));
    for (std::int64_t r = 0; r < v; ++r) {
      for (std::int64_t j = 0; j < c; ++j) {
        double s = std::fabs(d0.get(r * c + j));
        int reps = 0;
        for (std::int64_t t = 0; t < t_count; ++t)
          if (static_cast<std::int64_t>(ids.get(t)) == r)
            s += std::fabs(d_out.get(t * c + j)), ++reps;
        bound[static_cast<std::size_t>(r * c + j)] = reps * kU * s;
      }
    }
    EXPECT_TRUE(within_bounds(got, want, bound));
  }
}

TEST(DenseCpuVsRef, EmbeddingRejectsOutOfRangeIdsWithoutWriting) {
  const HostTensor table = random_tensor({4, 3}, DType::kF32, 1);
  for (double bad : {4.0, -1.0}) {
    const HostTensor ids = testing::from_values({3}, DType::kI32, {0, bad, 1});
    HostTensor out = zeros({3, 3}, DType::kF32);
    const Status s =
        cpu().embedding({.out = out.view(), .table = table.cview(), .ids = ids.cview()}, host());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_EQ(testing::max_abs(out), 0.0);
    HostTensor d_table = zeros({4, 3}, DType::kF32);
    const HostTensor d_out = random_tensor({3, 3}, DType::kF32, 2);
    const Status sb = cpu().embedding_backward(
        {.d_table = d_table.view(), .d_out = d_out.cview(), .ids = ids.cview()}, host());
    EXPECT_EQ(sb.code(), StatusCode::kInvalidArgument) << sb.to_string();
    EXPECT_EQ(testing::max_abs(d_table), 0.0);
  }
}

// ---------------------------------------------------------------- rms_norm

void run_rms_norm_case(std::int64_t n, std::int64_t c, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " c=" << c);
  const float eps = 1e-5f;
  const HostTensor x = random_tensor({n, c}, DType::kF32, seed, -2.0, 2.0);
  const HostTensor w = random_tensor({c}, DType::kF32, seed + 1, 0.5, 1.5);
  HostTensor y = zeros({n, c}, DType::kF32), rstd = zeros({n}, DType::kF32);
  HostTensor y_ref = zeros({n, c}, DType::kF64), rstd_ref = zeros({n}, DType::kF64);
  const HostTensor x64 = f64(x), w64 = f64(w);
  FERRY_ASSERT_OK(cpu().rms_norm(
      {.out = y.view(), .rstd = rstd.view(), .in = x.cview(), .weight = w.cview(), .eps = eps},
      host()));
  FERRY_ASSERT_OK(ref().rms_norm({.out = y_ref.view(),
                                  .rstd = rstd_ref.view(),
                                  .in = x64.cview(),
                                  .weight = w64.cview(),
                                  .eps = eps},
                                 host()));
  // Sum of squares over 16 lanes of ~C/16 terms plus a 4-level tree: relative error
  // <= (C/16 + 5) u; /C, +eps, sqrt (halves it), 1/x: rstd relative error <= (C/32 + 5) u;
  // out = (x rstd) w adds 2 roundings. Bounds: rstd (C/32 + 5) u, out (C/32 + 7) u, relative.
  const double rs_rel = (static_cast<double>(c) / 32.0 + 5.0) * kU;
  const double y_rel = rs_rel + 2.0 * kU;
  EXPECT_TRUE(testing::all_close(rstd, rstd_ref, 0.0, rs_rel));
  EXPECT_TRUE(testing::all_close(y, y_ref, 0.0, y_rel));

  // Backward, both backends fed the same f32 rstd.
  const HostTensor dy = random_tensor({n, c}, DType::kF32, seed + 2);
  const HostTensor dw0 = random_tensor({c}, DType::kF32, seed + 3);
  HostTensor dx = zeros({n, c}, DType::kF32), dw = dw0;
  HostTensor dx_ref = zeros({n, c}, DType::kF64), dw_ref = f64(dw0);
  const HostTensor dy64 = f64(dy), rstd64 = f64(rstd);
  FERRY_ASSERT_OK(cpu().rms_norm_backward({.d_in = dx.view(),
                                           .d_weight = dw.view(),
                                           .d_out = dy.cview(),
                                           .in = x.cview(),
                                           .weight = w.cview(),
                                           .rstd = rstd.cview()},
                                          host()));
  FERRY_ASSERT_OK(ref().rms_norm_backward({.d_in = dx_ref.view(),
                                           .d_weight = dw_ref.view(),
                                           .d_out = dy64.cview(),
                                           .in = x64.cview(),
                                           .weight = w64.cview(),
                                           .rstd = rstd64.cview()},
                                          host()));
  // d_in = t1 - t2, t1 = (r w) dy (2 roundings), t2 = x k, k = r^3 / C * dot (4 roundings on
  // top of dot's (C/16 + 6) u sum|dy w x| error), x k (1), the subtraction (1):
  // bound = 2u|t1| + 5u|t2| + |x| r^3 / C (C/16 + 6) u S + u |d_in|.
  std::vector<double> bx(static_cast<std::size_t>(n * c));
  for (std::int64_t r = 0; r < n; ++r) {
    const double rs = rstd.get(r);
    double s = 0.0, dot = 0.0;
    for (std::int64_t j = 0; j < c; ++j) {
      const double p = dy.get(r * c + j) * w.get(j) * x.get(r * c + j);
      s += std::fabs(p), dot += p;
    }
    const double k = rs * rs * rs / static_cast<double>(c) * dot;
    for (std::int64_t j = 0; j < c; ++j) {
      const double xv = x.get(r * c + j);
      const double t1 = rs * w.get(j) * dy.get(r * c + j), t2 = xv * k;
      bx[static_cast<std::size_t>(r * c + j)] =
          kU * (2.0 * std::fabs(t1) + 5.0 * std::fabs(t2) +
                std::fabs(xv) * rs * rs * rs / static_cast<double>(c) *
                    (static_cast<double>(c) / 16.0 + 6.0) * s +
                std::fabs(t1 - t2));
    }
  }
  EXPECT_TRUE(within_bounds(dx, dx_ref, bx));
  // d_weight: products and row sums in f64 (error ~ n 2^-53, far below u), then one rounding of
  // dw0 + sum to f32: bound 2u (|dw0| + sum_r |dy x r|).
  std::vector<double> bw(static_cast<std::size_t>(c));
  for (std::int64_t j = 0; j < c; ++j) {
    double s = std::fabs(dw0.get(j));
    for (std::int64_t r = 0; r < n; ++r)
      s += std::fabs(dy.get(r * c + j) * x.get(r * c + j) * rstd.get(r));
    bw[static_cast<std::size_t>(j)] = 2.0 * kU * s;
  }
  EXPECT_TRUE(within_bounds(dw, dw_ref, bw));
}

TEST(DenseCpuVsRef, RmsNormSweep) {
  for (std::int64_t n : {1, 7, 13})
    for (std::int64_t c : kSizes) run_rms_norm_case(n, c, 1000 + 31 * n + c);
  run_rms_norm_case(33, 4096, 77);  // large: rows split across threads, 256 SIMD blocks per row
}

// ---------------------------------------------------------------- rope

void run_rope_case(std::int64_t t_count, std::int64_t h, std::int64_t d, std::int64_t half,
                   float scale, bool backward, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "T=" << t_count << " H=" << h << " D=" << d
                                    << " R=" << 2 * half << " backward=" << backward);
  const HostTensor x0 = random_tensor({t_count, h, d}, DType::kF32, seed);
  HostTensor positions({t_count}, DType::kI32);
  for (std::int64_t t = 0; t < t_count; ++t)
    positions.set(t, static_cast<double>(3 * t + 5 * (t % 2) * 1000));
  HostTensor inv_freq({half}, DType::kF32);
  for (std::int64_t i = 0; i < half; ++i)
    inv_freq.set(i, std::pow(10000.0, -2.0 * static_cast<double>(i) / (2.0 * half)));
  HostTensor got = x0, want = f64(x0);
  RopeArgs args{.positions = positions.cview(),
                .inv_freq = inv_freq.cview(),
                .attention_scaling = scale,
                .backward = backward};
  args.x = got.view();
  FERRY_ASSERT_OK(cpu().rope(args, host()));
  args.x = want.view();
  FERRY_ASSERT_OK(ref().rope(args, host()));
  // cos, sin rounded to f32 (1 each), two products, the add, the scale: each output is within
  // 5 u |s| (|x1| + |x2|) of the exact value (|cos|, |sin| <= 1). Dims >= R are copied exactly.
  std::vector<double> bound(static_cast<std::size_t>(x0.numel()), 0.0);
  for (std::int64_t row = 0; row < t_count * h; ++row) {
    for (std::int64_t i = 0; i < half; ++i) {
      const double b = 5.0 * kU * std::fabs(scale) *
                       (std::fabs(x0.get(row * d + i)) + std::fabs(x0.get(row * d + i + half)));
      bound[static_cast<std::size_t>(row * d + i)] = b;
      bound[static_cast<std::size_t>(row * d + i + half)] = b;
    }
  }
  EXPECT_TRUE(within_bounds(got, want, bound));
}

TEST(DenseCpuVsRef, RopeSweepIncludingPartialRotary) {
  std::uint64_t seed = 500;
  for (std::int64_t t_count : {1, 7, 13}) {
    for (bool backward : {false, true}) {
      run_rope_case(t_count, 3, 16, 8, 1.0f, backward, seed++);    // full rotary
      run_rope_case(t_count, 2, 34, 7, 1.25f, backward, seed++);   // R = 14 < D = 34
      run_rope_case(t_count, 5, 128, 32, 0.9f, backward, seed++);  // partial, R = 64
    }
  }
  run_rope_case(129, 8, 128, 64, 1.0f, false, 9);  // large: tokens split across threads
}

TEST(DenseCpuVsRef, RopeRejectsRotaryDimsAboveHeadDim) {
  HostTensor x = random_tensor({2, 1, 4}, DType::kF32, 1);
  const HostTensor pos = testing::from_values({2}, DType::kI32, {0, 1});
  const HostTensor inv_freq = testing::from_values({3}, DType::kF32, {1.0, 0.1, 0.01});  // R = 6
  const Status s =
      cpu().rope({.x = x.view(), .positions = pos.cview(), .inv_freq = inv_freq.cview()}, host());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
}

// ---------------------------------------------------------------- swiglu

void run_swiglu_case(std::int64_t n, std::int64_t f, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " f=" << f);
  const HostTensor g = random_tensor({n, f}, DType::kF32, seed, -8.0, 8.0);
  const HostTensor u = random_tensor({n, f}, DType::kF32, seed + 1, -2.0, 2.0);
  const HostTensor dy = random_tensor({n, f}, DType::kF32, seed + 2);
  const HostTensor g64 = f64(g), u64 = f64(u), dy64 = f64(dy);
  HostTensor out = zeros({n, f}, DType::kF32), out_ref = zeros({n, f}, DType::kF64);
  FERRY_ASSERT_OK(cpu().swiglu({.out = out.view(), .gate = g.cview(), .up = u.cview()}, host()));
  FERRY_ASSERT_OK(
      ref().swiglu({.out = out_ref.view(), .gate = g64.cview(), .up = u64.cview()}, host()));
  // exp: <= 3 u relative (simd_kernels_test.cpp measures the polynomial against std::exp);
  // 1 + e and 1 / (.) one rounding each -> sig within 5 u; g * sig, * up: out within 7 u.
  EXPECT_TRUE(testing::all_close(out, out_ref, 0.0, 7.0 * kU));

  HostTensor dg = zeros({n, f}, DType::kF32), du = zeros({n, f}, DType::kF32);
  HostTensor dg_ref = zeros({n, f}, DType::kF64), du_ref = zeros({n, f}, DType::kF64);
  FERRY_ASSERT_OK(cpu().swiglu_backward({.d_gate = dg.view(),
                                         .d_up = du.view(),
                                         .d_out = dy.cview(),
                                         .gate = g.cview(),
                                         .up = u.cview()},
                                        host()));
  FERRY_ASSERT_OK(ref().swiglu_backward({.d_gate = dg_ref.view(),
                                         .d_up = du_ref.view(),
                                         .d_out = dy64.cview(),
                                         .gate = g64.cview(),
                                         .up = u64.cview()},
                                        host()));
  // d_up = dy (g sig): sig 5 u, two products -> 7 u relative.
  EXPECT_TRUE(testing::all_close(du, du_ref, 0.0, 7.0 * kU));
  // d_gate = ((dy u) s) inner, inner = 1 + g (1 - s). The 5 u relative error of s is an
  // absolute error <= 5 u s in 1 - s (plus 1 rounding), so inner is off by
  // <= u (|g| (5 s + 1) + 2 |g (1 - s)| + 1) in absolute terms (the product and the add round
  // once each); the outer factor carries 5 u (s) + 3 roundings.
  std::vector<double> bound(static_cast<std::size_t>(n * f));
  for (std::int64_t i = 0; i < n * f; ++i) {
    const double gv = g.get(i), s = 1.0 / (1.0 + std::exp(-gv));
    const double inner = 1.0 + gv * (1.0 - s);
    const double outer = std::fabs(dy.get(i) * u.get(i) * s);
    bound[static_cast<std::size_t>(i)] =
        outer * (8.0 * kU * std::fabs(inner) +
                 kU * (std::fabs(gv) * (5.0 * s + 1.0) + 2.0 * std::fabs(gv * (1.0 - s)) + 1.0));
  }
  EXPECT_TRUE(within_bounds(dg, dg_ref, bound));
}

TEST(DenseCpuVsRef, SwiGluSweep) {
  for (std::int64_t n : {1, 7})
    for (std::int64_t f : kSizes) run_swiglu_case(n, f, 2000 + 17 * n + f);
  run_swiglu_case(64, 1031, 91);  // large: 66k elements split across threads, odd tail
}

// The bf16 copy (SwiGluArgs::out16): out is the same bits as without it, out16 equals
// convert(out) bit for bit, on the CPU backend (its twin for CUDA:
// tests/gpu/kernels_dense_test.cpp) and on the reference; random values plus a product that
// overflows to +inf and a tiny one, over shapes with vector tails and a threaded split.
TEST(DenseCpuVsRef, SwiGluBf16CopyIsConvertOfTheOutput) {
  for (Backend* be : {&cpu(), &ref()}) {
    for (auto [n, f] :
         {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 7}, {7, 129}, {64, 1031}}) {
      SCOPED_TRACE(::testing::Message() << be->name() << " n=" << n << " f=" << f);
      HostTensor g = random_tensor({n, f}, DType::kF32, 7 * n + f, -8.0, 8.0);
      HostTensor u = random_tensor({n, f}, DType::kF32, 11 * n + f, -2.0, 2.0);
      if (n * f > 2) {
        g.set(0, 100.0);
        u.set(0, 3.0e38);  // silu(100) * 3e38 overflows: +inf in f32 and bf16
        u.set(1, 1.0e-30);
      }
      HostTensor plain = zeros({n, f}, DType::kF32), out = zeros({n, f}, DType::kF32);
      HostTensor out16 = zeros({n, f}, DType::kBF16), want16 = zeros({n, f}, DType::kBF16);
      FERRY_ASSERT_OK(
          be->swiglu({.out = plain.view(), .gate = g.cview(), .up = u.cview()}, host()));
      FERRY_ASSERT_OK(be->swiglu(
          {.out = out.view(), .gate = g.cview(), .up = u.cview(), .out16 = out16.view()}, host()));
      FERRY_ASSERT_OK(cpu().convert({.out = want16.view(), .in = out.cview()}, host()));
      const std::size_t bytes = static_cast<std::size_t>(n * f);
      EXPECT_EQ(std::memcmp(out.data(), plain.data(), bytes * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(out16.data(), want16.data(), bytes * sizeof(std::uint16_t)), 0);
    }
  }
  // A bf16 copy of the wrong shape or dtype is refused.
  const HostTensor g = random_tensor({2, 3}, DType::kF32, 1),
                   u = random_tensor({2, 3}, DType::kF32, 2);
  HostTensor out = zeros({2, 3}, DType::kF32), bad_shape = zeros({3, 2}, DType::kBF16),
             bad_dtype = zeros({2, 3}, DType::kF32);
  for (Backend* be : {&cpu(), &ref()}) {
    for (HostTensor* bad : {&bad_shape, &bad_dtype}) {
      const Status st = be->swiglu(
          {.out = out.view(), .gate = g.cview(), .up = u.cview(), .out16 = bad->view()}, host());
      EXPECT_FALSE(st.ok()) << be->name();
    }
  }
}

// RmsNormArgs::out16: out rounded to bf16 by the norm itself is convert(out) bit for bit, and
// out and rstd are the bits of the norm without the copy.
TEST(DenseCpuVsRef, RmsNormBf16CopyIsConvertOfTheOutput) {
  for (Backend* be : {&cpu(), &ref()}) {
    for (auto [n, c] :
         {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 7}, {7, 129}, {64, 1031}, {5, 3584}}) {
      SCOPED_TRACE(::testing::Message() << be->name() << " n=" << n << " c=" << c);
      const HostTensor x = random_tensor({n, c}, DType::kF32, 13 * n + c, -4.0, 4.0);
      HostTensor w = random_tensor({c}, DType::kF32, 17 * n + c, -2.0, 2.0);
      if (c > 2) {
        w.set(0, 3.0e38);  // overflows to +-inf in f32 and bf16 where |x r| > 1
        w.set(1, 1.0e-30);
      }
      HostTensor plain = zeros({n, c}, DType::kF32), out = zeros({n, c}, DType::kF32);
      HostTensor rstd_plain = zeros({n}, DType::kF32), rstd = zeros({n}, DType::kF32);
      HostTensor out16 = zeros({n, c}, DType::kBF16), want16 = zeros({n, c}, DType::kBF16);
      FERRY_ASSERT_OK(be->rms_norm({.out = plain.view(),
                                    .rstd = rstd_plain.view(),
                                    .in = x.cview(),
                                    .weight = w.cview(),
                                    .eps = 1e-6f},
                                   host()));
      FERRY_ASSERT_OK(be->rms_norm({.out = out.view(),
                                    .rstd = rstd.view(),
                                    .in = x.cview(),
                                    .weight = w.cview(),
                                    .eps = 1e-6f,
                                    .out16 = out16.view()},
                                   host()));
      FERRY_ASSERT_OK(cpu().convert({.out = want16.view(), .in = out.cview()}, host()));
      const std::size_t elems = static_cast<std::size_t>(n * c);
      EXPECT_EQ(std::memcmp(out.data(), plain.data(), elems * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(rstd.data(), rstd_plain.data(), static_cast<std::size_t>(n) * 4), 0);
      EXPECT_EQ(std::memcmp(out16.data(), want16.data(), elems * sizeof(std::uint16_t)), 0);
    }
  }
  // A bf16 copy of the wrong shape or dtype is refused.
  const HostTensor x = random_tensor({2, 3}, DType::kF32, 1),
                   w = random_tensor({3}, DType::kF32, 2);
  HostTensor out = zeros({2, 3}, DType::kF32), bad_shape = zeros({3, 2}, DType::kBF16),
             bad_dtype = zeros({2, 3}, DType::kF32);
  for (Backend* be : {&cpu(), &ref()}) {
    for (HostTensor* bad : {&bad_shape, &bad_dtype}) {
      const Status st = be->rms_norm(
          {.out = out.view(), .in = x.cview(), .weight = w.cview(), .out16 = bad->view()}, host());
      EXPECT_FALSE(st.ok()) << be->name();
    }
  }
}

// ---------------------------------------------------------------- add, sum_squares

TEST(DenseCpuVsRef, AddMatchesOneRoundingAndAllowsAliasing) {
  for (std::int64_t c : kSizes) {
    const HostTensor a = random_tensor({3, c}, DType::kF32, 60 + c);
    const HostTensor b = random_tensor({3, c}, DType::kF32, 70 + c);
    HostTensor out = zeros({3, c}, DType::kF32), want = zeros({3, c}, DType::kF64);
    const HostTensor a64 = f64(a), b64 = f64(b);
    FERRY_ASSERT_OK(cpu().add({.out = out.view(), .a = a.cview(), .b = b.cview()}, host()));
    FERRY_ASSERT_OK(ref().add({.out = want.view(), .a = a64.cview(), .b = b64.cview()}, host()));
    EXPECT_TRUE(testing::all_close(out, want, 0.0, kU)) << "c=" << c;  // one rounding
    HostTensor alias = a;                                              // out aliases a
    FERRY_ASSERT_OK(cpu().add({.out = alias.view(), .a = alias.cview(), .b = b.cview()}, host()));
    EXPECT_EQ(testing::max_abs_diff(alias, out), 0.0);
  }
  HostTensor big_a = random_tensor({2, 50000}, DType::kF32, 5);
  const HostTensor big_b = random_tensor({2, 50000}, DType::kF32, 6);
  HostTensor big_want = zeros({2, 50000}, DType::kF64);
  const HostTensor a64 = f64(big_a), b64 = f64(big_b);
  FERRY_ASSERT_OK(ref().add({.out = big_want.view(), .a = a64.cview(), .b = b64.cview()}, host()));
  FERRY_ASSERT_OK(cpu().add({.out = big_a.view(), .a = big_a.cview(), .b = big_b.cview()}, host()));
  EXPECT_TRUE(testing::all_close(big_a, big_want, 0.0, kU));
}

TEST(DenseCpuVsRef, SumSquaresWithinF64AccumulationBound) {
  for (std::int64_t n : {1, 7, 97, 129, 300001}) {
    const HostTensor x = random_tensor({n}, DType::kF32, 80 + static_cast<std::uint64_t>(n), -3, 3);
    const HostTensor x64 = f64(x);
    HostTensor out = zeros({1}, DType::kF32), want = zeros({1}, DType::kF64);
    FERRY_ASSERT_OK(cpu().sum_squares({.out = out.view(), .x = x.cview()}, host()));
    FERRY_ASSERT_OK(ref().sum_squares({.out = want.view(), .x = x64.cview()}, host()));
    // f32 squares are exact in f64; n f64 additions: n 2^-53 S; one final rounding to f32: u S.
    EXPECT_TRUE(testing::all_close(out, want, 0.0, kU + static_cast<double>(n) * 0x1p-53))
        << "n=" << n;
  }
}

// ---------------------------------------------------------------- error paths

TEST(DenseCpuVsRef, UnsupportedDtypesAndLayoutsReturnUnimplemented) {
  const HostTensor a16 = random_tensor({4, 3}, DType::kBF16, 1);
  const HostTensor b = random_tensor({3, 2}, DType::kF32, 2);
  HostTensor out = zeros({4, 2}, DType::kF32);
  Status s = cpu().gemm({.out = out.view(), .a = a16.cview(), .b = b.cview()}, host());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();

  const HostTensor x64 = random_tensor({2, 5}, DType::kF64, 3);
  const HostTensor w = random_tensor({5}, DType::kF32, 4);
  HostTensor y64 = zeros({2, 5}, DType::kF64);
  s = cpu().rms_norm({.out = y64.view(), .in = x64.cview(), .weight = w.cview()}, host());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();

  // A transposed (non-contiguous) view of a [5, 2] buffer, seen as [2, 5].
  HostTensor x = random_tensor({5, 2}, DType::kF32, 5);
  ConstTensorView xt = x.cview();
  xt.shape = {2, 5, 0, 0};
  xt.stride = {1, 2, 0, 0};
  HostTensor y = zeros({2, 5}, DType::kF32);
  s = cpu().rms_norm({.out = y.view(), .in = xt, .weight = w.cview()}, host());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();
}

TEST(DenseCpuVsRef, ShapeMismatchAndBadStepReturnInvalidArgument) {
  const HostTensor a = random_tensor({4, 3}, DType::kF32, 1);
  const HostTensor b = random_tensor({5, 2}, DType::kF32, 2);  // K = 3 vs 5
  HostTensor out = zeros({4, 2}, DType::kF32);
  Status s = cpu().gemm({.out = out.view(), .a = a.cview(), .b = b.cview()}, host());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  const HostTensor c = random_tensor({4, 2}, DType::kF32, 3);
  s = cpu().add({.out = out.view(), .a = a.cview(), .b = c.cview()}, host());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  HostTensor p = zeros({4}, DType::kF32);
  s = cpu().adamw({.param = p.view(), .m = p.view(), .v = p.view(), .grad = p.cview(), .step = 0},
                  host());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
}

}  // namespace
}  // namespace ferry::kernels
