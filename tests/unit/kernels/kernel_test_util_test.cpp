// SPDX-License-Identifier: Apache-2.0
// Tests the test helpers themselves: the gradient checker must accept a correct gradient and
// reject a wrong one, all_close must flag NaN and out-of-bound elements, and copies of a
// HostTensor must hold the same values independently of the source.
#include "unit/kernels/kernel_test_util.h"

namespace ferry::testing {
namespace {

TEST(KernelTestUtil, GradientCheckerAcceptsCorrectAndRejectsWrong) {
  // loss(x) = sum_i w_i x_i^3, so d loss / d x_i = 3 w_i x_i^2.
  HostTensor x = random_tensor({5, 3}, DType::kF64, 11);
  const HostTensor w = random_tensor({5, 3}, DType::kF64, 12);
  auto loss = [&] {
    double s = 0.0;
    for (std::int64_t i = 0; i < x.numel(); ++i) s += w.get(i) * x.get(i) * x.get(i) * x.get(i);
    return s;
  };
  HostTensor good = zeros({5, 3}, DType::kF64);
  HostTensor bad = zeros({5, 3}, DType::kF64);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    good.set(i, 3.0 * w.get(i) * x.get(i) * x.get(i));
    bad.set(i, 2.0 * w.get(i) * x.get(i) * x.get(i));  // wrong power-rule factor
  }
  EXPECT_TRUE(check_gradient(x, good, loss));
  EXPECT_FALSE(check_gradient(x, bad, loss));
}

TEST(KernelTestUtil, AllCloseFlagsNanAndOutOfBound) {
  const HostTensor want = from_values({3}, DType::kF64, {1.0, -2.0, 100.0});
  // bound for element 2 with atol 1e-3, rtol 1e-2: 1e-3 + 100 * 1e-2 = 1.001.
  EXPECT_TRUE(all_close(from_values({3}, DType::kF64, {1.0, -2.0, 101.0}), want, 1e-3, 1e-2));
  EXPECT_FALSE(all_close(from_values({3}, DType::kF64, {1.0, -2.0, 101.01}), want, 1e-3, 1e-2));
  EXPECT_FALSE(all_close(from_values({3}, DType::kF64, {NAN, -2.0, 100.0}), want, 1e-3, 1e-2));
}

TEST(KernelTestUtil, CopyIsDeepAndKeepsValues) {
  HostTensor a = random_tensor({4, 7}, DType::kF32, 3);
  a.set(0, 0.25);
  HostTensor b = a;
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  b.set(0, 1.25);  // exact in f32, so the difference is exactly 1
  EXPECT_EQ(max_abs_diff(a, b), 1.0);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % 64, 0u);
}

}  // namespace
}  // namespace ferry::testing
