// SPDX-License-Identifier: Apache-2.0
// The reference backend's dense ops on hand-computed cases (each derivation in a comment), its
// error statuses (bad ids, shapes, dtypes, layouts, hyper-parameters) and supports(). The
// reference is the spec the CPU backend is tested against (dense_cpu_vs_ref_test.cpp), so these
// cases pin the spec itself.
#include <cmath>
#include <limits>
#include <numbers>

#include "kernels/backend.h"
#include "unit/kernels/kernel_test_util.h"

namespace ferry::kernels {
namespace {

using testing::from_values;
using testing::HostTensor;
using testing::zeros;

Stream& host() { return Stream::host(); }
Backend& ref() { return reference_backend(); }

void expect_values(const HostTensor& t, const std::vector<double>& want, double tol = 0.0) {
  ASSERT_EQ(t.numel(), static_cast<std::int64_t>(want.size()));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    EXPECT_NEAR(t.get(i), want[static_cast<std::size_t>(i)], tol) << "i=" << i;
  }
}

TEST(DenseRef, GemmHandComputedWithFlags) {
  // A = [[1,2],[3,4]], B = [[5,6],[7,8]].
  const HostTensor a = from_values({2, 2}, DType::kF32, {1, 2, 3, 4});
  const HostTensor b = from_values({2, 2}, DType::kF32, {5, 6, 7, 8});
  HostTensor out = zeros({2, 2}, DType::kF32);
  // A B = [[1*5+2*7, 1*6+2*8], [3*5+4*7, 3*6+4*8]] = [[19, 22], [43, 50]].
  FERRY_ASSERT_OK(ref().gemm({.out = out.view(), .a = a.cview(), .b = b.cview()}, host()));
  expect_values(out, {19, 22, 43, 50});
  // A^T B = [[1,3],[2,4]] B = [[1*5+3*7, 1*6+3*8], [2*5+4*7, 2*6+4*8]] = [[26, 30], [38, 44]].
  FERRY_ASSERT_OK(
      ref().gemm({.out = out.view(), .a = a.cview(), .b = b.cview(), .trans_a = true}, host()));
  expect_values(out, {26, 30, 38, 44});
  // A B^T = A [[5,7],[6,8]] = [[1*5+2*6, 1*7+2*8], [3*5+4*6, 3*7+4*8]] = [[17, 23], [39, 53]].
  FERRY_ASSERT_OK(
      ref().gemm({.out = out.view(), .a = a.cview(), .b = b.cview(), .trans_b = true}, host()));
  expect_values(out, {17, 23, 39, 53});
  // alpha 2, beta 0.5 on out = 1, bias [10, 20]: 2 A B + 0.5 + bias
  //   = [[38.5 + 10, 44.5 + 20], [86.5 + 10, 100.5 + 20]].
  out.fill(1.0);
  const HostTensor bias = from_values({2}, DType::kF32, {10, 20});
  FERRY_ASSERT_OK(ref().gemm({.out = out.view(),
                              .a = a.cview(),
                              .b = b.cview(),
                              .bias = bias.cview(),
                              .alpha = 2.0f,
                              .beta = 0.5f},
                             host()));
  expect_values(out, {48.5, 64.5, 96.5, 120.5});
}

TEST(DenseRef, GemmNonSquareBf16InputsAndBetaZeroIgnoresOut) {
  // [1, 3] @ [3, 2]: [1, 2, 3] @ [[1, 0], [0, 1], [1, 1]] = [1 + 3, 2 + 3] = [4, 5]. The values
  // are exact in bf16, and beta = 0 must not read the NaN already in out.
  const HostTensor a = from_values({1, 3}, DType::kBF16, {1, 2, 3});
  const HostTensor b = from_values({3, 2}, DType::kBF16, {1, 0, 0, 1, 1, 1});
  HostTensor out = from_values({1, 2}, DType::kF64, {NAN, NAN});
  FERRY_ASSERT_OK(ref().gemm({.out = out.view(), .a = a.cview(), .b = b.cview()}, host()));
  expect_values(out, {4, 5});
}

TEST(DenseRef, GemmBadArgumentsReturnStatus) {
  const HostTensor a = zeros({2, 3}, DType::kF32), b = zeros({4, 2}, DType::kF32);
  HostTensor out = zeros({2, 2}, DType::kF32);
  // K mismatch: a is [2, 3], b is [4, 2].
  EXPECT_EQ(ref().gemm({.out = out.view(), .a = a.cview(), .b = b.cview()}, host()).code(),
            StatusCode::kInvalidArgument);
  const HostTensor ai = zeros({2, 4}, DType::kI32);
  EXPECT_EQ(ref().gemm({.out = out.view(), .a = ai.cview(), .b = b.cview()}, host()).code(),
            StatusCode::kUnimplemented);
  // A transposed (non-contiguous) view of out.
  TensorView strided = out.view();
  strided.stride = {1, 2, 0, 0};
  const HostTensor a2 = zeros({2, 4}, DType::kF32);
  EXPECT_EQ(ref().gemm({.out = strided, .a = a2.cview(), .b = b.cview()}, host()).code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(ref().gemm({.out = out.view(), .a = {}, .b = b.cview()}, host()).code(),
            StatusCode::kInvalidArgument);
}

TEST(DenseRef, EmbeddingGathersAndRejectsOutOfRangeIds) {
  const HostTensor table = from_values({3, 2}, DType::kBF16, {1, 2, 3, 4, 5, 6});
  const HostTensor ids = from_values({3}, DType::kI32, {2, 0, 2});
  HostTensor out = zeros({3, 2}, DType::kF32);
  FERRY_ASSERT_OK(
      ref().embedding({.out = out.view(), .table = table.cview(), .ids = ids.cview()}, host()));
  expect_values(out, {5, 6, 1, 2, 5, 6});
  for (double bad_id : {3.0, -1.0}) {
    const HostTensor bad = from_values({3}, DType::kI32, {0, bad_id, 1});
    out.fill(7.0);
    const Status s =
        ref().embedding({.out = out.view(), .table = table.cview(), .ids = bad.cview()}, host());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    expect_values(out, {7, 7, 7, 7, 7, 7});  // nothing written before the check
    HostTensor d_table = zeros({3, 2}, DType::kF32);
    EXPECT_EQ(ref()
                  .embedding_backward(
                      {.d_table = d_table.view(), .d_out = out.cview(), .ids = bad.cview()}, host())
                  .code(),
              StatusCode::kInvalidArgument);
  }
}

TEST(DenseRef, RmsNormHandComputed) {
  // x = [3, 4], eps 0: mean(x^2) = (9 + 16) / 2 = 12.5, r = 1/sqrt(12.5) = 0.28284271;
  // w = [1, 2] gives y = [3 r, 8 r] = [0.84852814, 2.26274170].
  const HostTensor x = from_values({1, 2}, DType::kF64, {3, 4});
  const HostTensor w = from_values({2}, DType::kF64, {1, 2});
  HostTensor y = zeros({1, 2}, DType::kF64), rstd = zeros({1}, DType::kF32);
  FERRY_ASSERT_OK(ref().rms_norm(
      {.out = y.view(), .rstd = rstd.view(), .in = x.cview(), .weight = w.cview(), .eps = 0.0f},
      host()));
  const double r = 1.0 / std::sqrt(12.5);
  expect_values(y, {3 * r, 8 * r}, 1e-15);
  EXPECT_EQ(rstd.get(0), static_cast<float>(r));
  HostTensor w_bad = zeros({3}, DType::kF64);
  EXPECT_EQ(
      ref().rms_norm({.out = y.view(), .in = x.cview(), .weight = w_bad.cview()}, host()).code(),
      StatusCode::kInvalidArgument);
}

TEST(DenseRef, RopeHandComputedQuarterTurn) {
  // x = [1, 2, 3, 4] (T = H = 1, D = R = 4), position 1, inv_freq = [pi/2, 0]:
  // pair (0, 2) turns by ~90 degrees: x0' = 1 cos - 3 sin = -3, x2' = 3 cos + 1 sin = 1;
  // pair (1, 3) has angle 0 and stays [2, 4]. Scaling 2 doubles everything rotated.
  // cos(f32(pi/2)) = -4.4e-8, hence the 1e-6 tolerance.
  const HostTensor pos = from_values({1}, DType::kI32, {1});
  const HostTensor inv = from_values({2}, DType::kF32, {std::numbers::pi / 2, 0});
  HostTensor x = from_values({1, 1, 4}, DType::kF64, {1, 2, 3, 4});
  RopeArgs args{
      .x = x.view(), .positions = pos.cview(), .inv_freq = inv.cview(), .attention_scaling = 2.0f};
  FERRY_ASSERT_OK(ref().rope(args, host()));
  expect_values(x, {-6, 4, 2, 8}, 1e-6);
  // Backward turns by -90 degrees: [1, 2, 3, 4] -> [1 cos + 3 sin, 2, 3 cos - 1 sin, 4] =
  // [3,2,-1,4].
  x = from_values({1, 1, 4}, DType::kF64, {1, 2, 3, 4});
  args.x = x.view();
  args.attention_scaling = 1.0f;
  args.backward = true;
  FERRY_ASSERT_OK(ref().rope(args, host()));
  expect_values(x, {3, 2, -1, 4}, 1e-6);
  // Partial rotary: D = 6 with R = 4 leaves dims 4, 5 untouched, even with scaling.
  HostTensor xp = from_values({1, 1, 6}, DType::kF64, {1, 2, 3, 4, 5, 6});
  args.x = xp.view();
  args.attention_scaling = 2.0f;
  args.backward = false;
  FERRY_ASSERT_OK(ref().rope(args, host()));
  expect_values(xp, {-6, 4, 2, 8, 5, 6}, 1e-6);
  // R = 6 > D = 4 is rejected.
  const HostTensor inv3 = from_values({3}, DType::kF32, {1, 1, 1});
  args.x = x.view();
  args.inv_freq = inv3.cview();
  EXPECT_EQ(ref().rope(args, host()).code(), StatusCode::kInvalidArgument);
}

TEST(DenseRef, SwiGluHandComputed) {
  // g = 0: sigmoid 0.5, silu 0. g = ln 3: sigmoid = 1 / (1 + 1/3) = 0.75, silu = 0.75 ln 3.
  const HostTensor g = from_values({1, 2}, DType::kF64, {0, std::log(3.0)});
  const HostTensor u = from_values({1, 2}, DType::kF64, {5, 2});
  HostTensor y = zeros({1, 2}, DType::kF64);
  FERRY_ASSERT_OK(ref().swiglu({.out = y.view(), .gate = g.cview(), .up = u.cview()}, host()));
  expect_values(y, {0, 2 * 0.75 * std::log(3.0)}, 1e-15);
  // Backward with d_out = 1: d_up = silu(g) = [0, 0.75 ln 3];
  // d_gate = u sigmoid (1 + g (1 - sigmoid)) = [5 * 0.5 * 1, 2 * 0.75 * (1 + 0.25 ln 3)].
  const HostTensor dy = from_values({1, 2}, DType::kF64, {1, 1});
  HostTensor dg = zeros({1, 2}, DType::kF64), du = zeros({1, 2}, DType::kF64);
  FERRY_ASSERT_OK(ref().swiglu_backward({.d_gate = dg.view(),
                                         .d_up = du.view(),
                                         .d_out = dy.cview(),
                                         .gate = g.cview(),
                                         .up = u.cview()},
                                        host()));
  expect_values(du, {0, 0.75 * std::log(3.0)}, 1e-15);
  expect_values(dg, {2.5, 1.5 * (1 + 0.25 * std::log(3.0))}, 1e-15);
}

TEST(DenseRef, AddAliasedAndMismatched) {
  HostTensor a = from_values({3}, DType::kF32, {1, 2, 3});
  const HostTensor b = from_values({3}, DType::kF32, {10, 20, 30});
  FERRY_ASSERT_OK(ref().add({.out = a.view(), .a = a.cview(), .b = b.cview()}, host()));
  expect_values(a, {11, 22, 33});
  const HostTensor c = zeros({4}, DType::kF32);
  EXPECT_EQ(ref().add({.out = a.view(), .a = a.cview(), .b = c.cview()}, host()).code(),
            StatusCode::kInvalidArgument);
}

TEST(DenseRef, AdamWTwoStepsHandUnrolled) {
  // Hyper-parameters exact in f32 so the f64 reference sees the same numbers as this derivation:
  // b1 = 0.875, b2 = 0.96875, lr = 0.125, eps = 2^-20, wd = 0.0625, grad_scale 2; p0 = 1.
  // Step 1, grad 0.5 -> g = 1: m = 0.125, v = 0.03125; m / (1 - b1) = 1, v / (1 - b2) = 1;
  //   p1 = 1 - 0.125 (1 / (1 + 2^-20) + 0.0625 * 1) = 0.86718761920917...
  // Step 2, grad -0.25 -> g = -0.5: m = 0.109375 - 0.0625 = 0.046875,
  //   v = 0.0302734375 + 0.0078125 = 0.0380859375; bias corrections 1 - b1^2 = 0.234375,
  //   1 - b2^2 = 0.0615234375; p2 = p1 - 0.125 (0.2 / (sqrt(0.61904762) + 2^-20) + 0.0625 p1)
  //   = 0.82863830898271...
  HostTensor p = from_values({1}, DType::kF64, {1.0});
  HostTensor m = zeros({1}, DType::kF64), v = zeros({1}, DType::kF64);
  AdamWArgs args{.param = p.view(),
                 .m = m.view(),
                 .v = v.view(),
                 .lr = 0.125f,
                 .beta1 = 0.875f,
                 .beta2 = 0.96875f,
                 .eps = 0x1p-20f,
                 .weight_decay = 0.0625f,
                 .grad_scale = 2.0f};
  const HostTensor g1 = from_values({1}, DType::kF64, {0.5});
  args.grad = g1.cview();
  args.step = 1;
  FERRY_ASSERT_OK(ref().adamw(args, host()));
  EXPECT_EQ(m.get(0), 0.125);
  EXPECT_EQ(v.get(0), 0.03125);
  const double p1 = 1.0 - 0.125 * (1.0 / (1.0 + 0x1p-20) + 0.0625);
  EXPECT_NEAR(p.get(0), p1, 1e-15);
  EXPECT_NEAR(p.get(0), 0.86718761920917, 1e-13);
  const HostTensor g2 = from_values({1}, DType::kF64, {-0.25});
  args.grad = g2.cview();
  args.step = 2;
  FERRY_ASSERT_OK(ref().adamw(args, host()));
  EXPECT_EQ(m.get(0), 0.046875);
  EXPECT_EQ(v.get(0), 0.0380859375);
  const double p2 =
      p1 - 0.125 * ((0.046875 / 0.234375) / (std::sqrt(0.0380859375 / 0.0615234375) + 0x1p-20) +
                    0.0625 * p1);
  EXPECT_NEAR(p.get(0), p2, 1e-15);
  EXPECT_NEAR(p.get(0), 0.82863830898271, 1e-13);
}

TEST(DenseRef, AdamWBf16WriteOutAndBadHyperParameters) {
  HostTensor p = testing::random_tensor({37}, DType::kF32, 21);
  HostTensor m = zeros({37}, DType::kF32), v = zeros({37}, DType::kF32);
  HostTensor pb = zeros({37}, DType::kBF16);
  const HostTensor g = testing::random_tensor({37}, DType::kF32, 22);
  AdamWArgs args{.param = p.view(),
                 .m = m.view(),
                 .v = v.view(),
                 .param_bf16 = pb.view(),
                 .grad = g.cview(),
                 .lr = 1e-2f,
                 .weight_decay = 0.1f};
  FERRY_ASSERT_OK(ref().adamw(args, host()));
  for (int i = 0; i < 37; ++i) {
    EXPECT_EQ(static_cast<const std::uint16_t*>(pb.data())[i],
              f32_to_bf16(static_cast<const float*>(p.data())[i]))
        << "i=" << i;
  }
  args.step = 0;
  EXPECT_EQ(ref().adamw(args, host()).code(), StatusCode::kInvalidArgument);
  args.step = 1;
  args.beta2 = 1.0f;
  EXPECT_EQ(ref().adamw(args, host()).code(), StatusCode::kInvalidArgument);
}

TEST(DenseRef, SumSquares) {
  // 1 + 4 + 9 = 14; bf16 [0.5, -1.5]: 0.25 + 2.25 = 2.5.
  HostTensor out = zeros({1}, DType::kF32);
  const HostTensor x = from_values({3}, DType::kF32, {1, 2, 3});
  FERRY_ASSERT_OK(ref().sum_squares({.out = out.view(), .x = x.cview()}, host()));
  EXPECT_EQ(out.get(0), 14.0);
  const HostTensor xb = from_values({2}, DType::kBF16, {0.5, -1.5});
  FERRY_ASSERT_OK(ref().sum_squares({.out = out.view(), .x = xb.cview()}, host()));
  EXPECT_EQ(out.get(0), 2.5);
}

TEST(DenseRef, SupportsAndNames) {
  EXPECT_EQ(reference_backend().name(), "reference");
  EXPECT_EQ(cpu_backend().name(), "cpu");
  EXPECT_TRUE(reference_backend().supports(OpKind::kGemm, DType::kF64));
  EXPECT_TRUE(reference_backend().supports(OpKind::kGemm, DType::kBF16));
  EXPECT_FALSE(reference_backend().supports(OpKind::kRmsNorm, DType::kBF16));
  EXPECT_FALSE(reference_backend().supports(OpKind::kAdd, DType::kI32));
  EXPECT_TRUE(cpu_backend().supports(OpKind::kRmsNorm, DType::kF32));
  EXPECT_FALSE(cpu_backend().supports(OpKind::kRmsNorm, DType::kF64));
}

}  // namespace
}  // namespace ferry::kernels
