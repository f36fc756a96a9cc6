// SPDX-License-Identifier: Apache-2.0
// Finite-difference checks of every dense backward on the reference backend in f64: each test
// forms the scalar loss L = sum(out * P) for a random projection P (so dL/dout = P), runs the
// backward op with d_out = P, and compares against central differences of L
// (kernel_test_util.h: check_gradient, whose header derives its tolerances). Also checks that
// rope's backward is the exact transpose of its forward, and that gemm with the transpose flags
// yields the matmul gradients (dA = dY B^T, dB = A^T dY).
#include <vector>

#include "kernels/backend.h"
#include "unit/kernels/kernel_test_util.h"

namespace ferry::kernels {
namespace {

using testing::check_gradient;
using testing::dot;
using testing::HostTensor;
using testing::random_tensor;
using testing::zeros;

Stream& host() { return Stream::host(); }
Backend& ref() { return reference_backend(); }

TEST(DenseFd, GemmTransposeFlagsGiveMatmulGradients) {
  const std::int64_t m = 3, k = 5, n = 4;
  HostTensor a = random_tensor({m, k}, DType::kF64, 1);
  HostTensor b = random_tensor({k, n}, DType::kF64, 2);
  const HostTensor p = random_tensor({m, n}, DType::kF64, 3);
  HostTensor y = zeros({m, n}, DType::kF64);
  auto loss = [&] {
    FERRY_CHECK_OK(ref().gemm({.out = y.view(), .a = a.cview(), .b = b.cview()}, host()));
    return dot(y, p);
  };
  HostTensor da = zeros({m, k}, DType::kF64), db = zeros({k, n}, DType::kF64);
  // dA [M, K] = P [M, N] @ B^T ; dB [K, N] = A^T @ P.
  FERRY_ASSERT_OK(
      ref().gemm({.out = da.view(), .a = p.cview(), .b = b.cview(), .trans_b = true}, host()));
  FERRY_ASSERT_OK(
      ref().gemm({.out = db.view(), .a = a.cview(), .b = p.cview(), .trans_a = true}, host()));
  EXPECT_TRUE(check_gradient(a, da, loss));
  EXPECT_TRUE(check_gradient(b, db, loss));
}

TEST(DenseFd, EmbeddingBackwardSumsRepeatedIdsAndAccumulates) {
  const std::int64_t v = 5, c = 3;
  HostTensor table = random_tensor({v, c}, DType::kF64, 4);
  // Ids 1 and 3 repeat (twice and three times); id 2 never occurs, so its gradient row is 0.
  const HostTensor ids = testing::from_values({7}, DType::kI32, {1, 3, 1, 0, 3, 3, 4});
  const HostTensor p = random_tensor({7, c}, DType::kF64, 5);
  HostTensor out = zeros({7, c}, DType::kF64);
  auto loss = [&] {
    FERRY_CHECK_OK(
        ref().embedding({.out = out.view(), .table = table.cview(), .ids = ids.cview()}, host()));
    return dot(out, p);
  };
  const HostTensor d0 = random_tensor({v, c}, DType::kF64, 6);
  HostTensor d_table = d0;
  FERRY_ASSERT_OK(ref().embedding_backward(
      {.d_table = d_table.view(), .d_out = p.cview(), .ids = ids.cview()}, host()));
  HostTensor added = zeros({v, c}, DType::kF64);  // what backward added on top of d0
  for (std::int64_t i = 0; i < added.numel(); ++i) added.set(i, d_table.get(i) - d0.get(i));
  EXPECT_TRUE(check_gradient(table, added, loss));
  for (std::int64_t j = 0; j < c; ++j) EXPECT_EQ(added.get(2 * c + j), 0.0);
}

TEST(DenseFd, RmsNormBackwardInputAndWeight) {
  const std::int64_t n = 4, c = 7;
  HostTensor x = random_tensor({n, c}, DType::kF64, 7);
  HostTensor w = random_tensor({c}, DType::kF64, 8, 0.5, 1.5);
  const HostTensor p = random_tensor({n, c}, DType::kF64, 9);
  HostTensor y = zeros({n, c}, DType::kF64), rstd = zeros({n}, DType::kF64);
  const float eps = 1e-5f;
  auto loss = [&] {
    FERRY_CHECK_OK(ref().rms_norm(
        {.out = y.view(), .rstd = rstd.view(), .in = x.cview(), .weight = w.cview(), .eps = eps},
        host()));
    return dot(y, p);
  };
  loss();  // fills rstd for the unperturbed x
  HostTensor dx = zeros({n, c}, DType::kF64);
  const HostTensor dw0 = random_tensor({c}, DType::kF64, 10);
  HostTensor dw = dw0;
  FERRY_ASSERT_OK(ref().rms_norm_backward({.d_in = dx.view(),
                                           .d_weight = dw.view(),
                                           .d_out = p.cview(),
                                           .in = x.cview(),
                                           .weight = w.cview(),
                                           .rstd = rstd.cview()},
                                          host()));
  HostTensor dw_added = zeros({c}, DType::kF64);
  for (std::int64_t j = 0; j < c; ++j) dw_added.set(j, dw.get(j) - dw0.get(j));
  EXPECT_TRUE(check_gradient(x, dx, loss));
  EXPECT_TRUE(check_gradient(w, dw_added, loss));
}

TEST(DenseFd, SwiGluBackwardGateAndUp) {
  const std::int64_t n = 3, f = 11;
  HostTensor g = random_tensor({n, f}, DType::kF64, 11, -6.0, 6.0);
  HostTensor u = random_tensor({n, f}, DType::kF64, 12, -2.0, 2.0);
  const HostTensor p = random_tensor({n, f}, DType::kF64, 13);
  HostTensor y = zeros({n, f}, DType::kF64);
  auto loss = [&] {
    FERRY_CHECK_OK(ref().swiglu({.out = y.view(), .gate = g.cview(), .up = u.cview()}, host()));
    return dot(y, p);
  };
  HostTensor dg = zeros({n, f}, DType::kF64), du = zeros({n, f}, DType::kF64);
  FERRY_ASSERT_OK(ref().swiglu_backward({.d_gate = dg.view(),
                                         .d_up = du.view(),
                                         .d_out = p.cview(),
                                         .gate = g.cview(),
                                         .up = u.cview()},
                                        host()));
  EXPECT_TRUE(check_gradient(g, dg, loss));
  EXPECT_TRUE(check_gradient(u, du, loss));
}

// Rope setup shared by the two rope tests: T = 5 tokens, H = 2 heads, D = 10, R = 6 (partial).
struct RopeCase {
  HostTensor positions = testing::from_values({5}, DType::kI32, {0, 1, 7, 300, 4099});
  HostTensor inv_freq = testing::from_values({3}, DType::kF32, {1.0, 0.3, 0.01});
  float scaling = 1.25f;
  Status apply(HostTensor& x, bool backward) const {
    return ref().rope({.x = x.view(),
                       .positions = positions.cview(),
                       .inv_freq = inv_freq.cview(),
                       .attention_scaling = scaling,
                       .backward = backward},
                      host());
  }
};

TEST(DenseFd, RopeBackwardIsTheGradient) {
  const RopeCase rc;
  HostTensor x = random_tensor({5, 2, 10}, DType::kF64, 14);
  const HostTensor p = random_tensor({5, 2, 10}, DType::kF64, 15);
  auto loss = [&] {
    HostTensor y = x;
    FERRY_CHECK_OK(rc.apply(y, /*backward=*/false));
    return dot(y, p);
  };
  HostTensor dx = p;
  FERRY_ASSERT_OK(rc.apply(dx, /*backward=*/true));
  EXPECT_TRUE(check_gradient(x, dx, loss));
  // Pass-through dims [R, D) have gradient exactly P there.
  for (std::int64_t row = 0; row < 10; ++row) {
    for (std::int64_t j = 6; j < 10; ++j) EXPECT_EQ(dx.get(row * 10 + j), p.get(row * 10 + j));
  }
}

TEST(DenseFd, RopeBackwardIsExactTranspose) {
  // <F x, y> = <x, F^T y> for the linear map F; in f64 both sides agree to rounding (~1e-15
  // relative per term, 100 terms of size ~1).
  const RopeCase rc;
  const HostTensor x = random_tensor({5, 2, 10}, DType::kF64, 16);
  const HostTensor y = random_tensor({5, 2, 10}, DType::kF64, 17);
  HostTensor fx = x, fty = y;
  FERRY_ASSERT_OK(rc.apply(fx, false));
  FERRY_ASSERT_OK(rc.apply(fty, true));
  EXPECT_NEAR(dot(fx, y), dot(x, fty), 1e-12);
  // And backward(forward(x)) = scaling^2 x: rotations by +angle then -angle cancel on [0, R),
  // while the pass-through dims are untouched by both.
  HostTensor round_trip = fx;
  FERRY_ASSERT_OK(rc.apply(round_trip, true));
  const double s2 = static_cast<double>(rc.scaling) * rc.scaling;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const bool rotated = i % 10 < 6;
    EXPECT_NEAR(round_trip.get(i), rotated ? s2 * x.get(i) : x.get(i), 1e-12) << "i=" << i;
  }
}

}  // namespace
}  // namespace ferry::kernels
