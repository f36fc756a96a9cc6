// SPDX-License-Identifier: Apache-2.0
// AdamW (ops.h formula) on the CPU and reference backends:
//   - two steps unrolled by hand on four elements, against literal derivations;
//   - the CPU's f32 step vs the reference's f64 step from identical states, swept sizes and step
//     numbers, with a per-element bound derived from counting f32 roundings;
//   - the bf16 write-out equals f32_to_bf16 of the stored f32 parameter, bit for bit, including
//     rounding ties, overflow to infinity, NaN and signed zero.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/backend.h"
#include "unit/kernels/kernel_test_util.h"

namespace ferry::kernels {
namespace {

using testing::converted;
using testing::from_values;
using testing::HostTensor;
using testing::random_tensor;
using testing::zeros;

constexpr double kU = 0x1p-24;
Stream& host() { return Stream::host(); }

struct Hyper {
  float lr = 0.01f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
};

AdamWArgs make_args(HostTensor& p, HostTensor& m, HostTensor& v, const HostTensor& g,
                    const Hyper& h, std::int64_t step) {
  return AdamWArgs{.param = p.view(),
                   .m = m.view(),
                   .v = v.view(),
                   .grad = g.cview(),
                   .lr = h.lr,
                   .beta1 = h.beta1,
                   .beta2 = h.beta2,
                   .eps = h.eps,
                   .weight_decay = h.wd,
                   .grad_scale = h.gs,
                   .step = step};
}

TEST(AdamWStep, TwoStepsUnrolledByHand) {
  const Hyper h;
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.wd, gs = h.gs;
  const std::vector<double> p0 = {1.0, -0.5, 0.25, 2.0};
  const std::vector<double> g1 = {0.1, -0.2, 0.0, 3.0}, g2 = {-0.1, 0.4, 0.5, 3.0};
  // Step 1 (bias corrections 1 - b1, 1 - b2 cancel the (1 - b) factors): mhat = g, vhat = g^2,
  // so p1 = p0 - lr (g / (|g| + eps) + wd p0) with g = 0.5 grad. Element 0: g = 0.05,
  // p1 = 1 - 0.01 (0.05 / 0.05000001 + 0.1) = 0.9890000019999996. Element 2 (g = 0):
  // p1 = 0.25 (1 - lr wd) = 0.24975.
  std::vector<double> p1(4), m1(4), v1(4), p2(4);
  for (int i = 0; i < 4; ++i) {
    const double g = gs * g1[i];
    m1[i] = (1 - b1) * g;
    v1[i] = (1 - b2) * g * g;
    p1[i] = p0[i] - lr * ((m1[i] / (1 - b1)) / (std::sqrt(v1[i] / (1 - b2)) + eps) + wd * p0[i]);
  }
  // The literals use decimal hyper-parameters; the computation uses their f32 roundings (lr is
  // 0.01 - 2.2e-10), which moves p1 by < lr's error * |update| (1.1) < 3e-10.
  EXPECT_NEAR(p1[0], 0.9890000019999996, 3e-10);
  EXPECT_NEAR(p1[2], 0.24975, 3e-10);
  // Step 2: m2 = b1 m1 + (1 - b1) g, v2 = b2 v1 + (1 - b2) g^2, corrections 1 - b^2.
  for (int i = 0; i < 4; ++i) {
    const double g = gs * g2[i];
    const double m2 = b1 * m1[i] + (1 - b1) * g;
    const double v2 = b2 * v1[i] + (1 - b2) * g * g;
    p2[i] =
        p1[i] - lr * ((m2 / (1 - b1 * b1)) / (std::sqrt(v2 / (1 - b2 * b2)) + eps) + wd * p1[i]);
  }
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    const DType dt = be == &reference_backend() ? DType::kF64 : DType::kF32;
    SCOPED_TRACE(be->name());
    HostTensor p = from_values({4}, dt, p0), m = zeros({4}, dt), v = zeros({4}, dt);
    const HostTensor ga = from_values({4}, dt, g1), gb = from_values({4}, dt, g2);
    FERRY_ASSERT_OK(be->adamw(make_args(p, m, v, ga, h, 1), host()));
    // f64: the hand computation uses the same f32 hyper-parameters, so 1e-12 is f64 rounding
    // noise. f32: each step is within about 10 u |p| + 10 u lr of exact (the bound derived in
    // run_cpu_vs_ref); two steps with |p| <= 2.1: 2 (10 u 2.1 + 10 u 0.01) < 2.6e-6.
    const double tol = dt == DType::kF64 ? 1e-12 : 2.6e-6;
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(p.get(i), p1[i], tol) << "step 1, element " << i;
    FERRY_ASSERT_OK(be->adamw(make_args(p, m, v, gb, h, 2), host()));
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(p.get(i), p2[i], tol) << "step 2, element " << i;
  }
}

// One CPU step vs one reference step from identical f32 states.
void run_cpu_vs_ref(std::int64_t n, std::int64_t step, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " step=" << step);
  const Hyper h{.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-6f, .wd = 0.05f, .gs = 0.7f};
  const HostTensor p0 = random_tensor({n}, DType::kF32, seed, -1, 1);
  const HostTensor m0 = random_tensor({n}, DType::kF32, seed + 1, -0.1, 0.1);
  const HostTensor v0 = random_tensor({n}, DType::kF32, seed + 2, 0.0, 0.02);
  const HostTensor g = random_tensor({n}, DType::kF32, seed + 3, -0.5, 0.5);
  HostTensor p = p0, m = m0, v = v0;
  HostTensor p64 = converted(p0, DType::kF64), m64 = converted(m0, DType::kF64),
             v64 = converted(v0, DType::kF64);
  const HostTensor g64 = converted(g, DType::kF64);
  FERRY_ASSERT_OK(cpu_backend().adamw(make_args(p, m, v, g, h, step), host()));
  FERRY_ASSERT_OK(reference_backend().adamw(make_args(p64, m64, v64, g64, h, step), host()));
  // Rounding count of the CPU's evaluation order (1 - b is exact in f32 for b in [0.5, 1)):
  //   g' = g gs (1); m = b1 m0 + (1-b1) g' (2 + g'): |dm| <= 3u M, M = |b1 m0| + |(1-b1) g'|;
  //   v = b2 v0 + (1-b2) g'^2 (no cancellation): 5u relative;
  //   mhat = m inv_bc1 (inv_bc1 rounded, product): |dmhat| <= inv_bc1 (3u M + 2u |m|);
  //   denom = sqrt(v inv_bc2) + eps: (5 + 2)/2 + 1 + 1 = 5.5u relative;
  //   ratio = mhat / denom: |ratio| 6.5u + |dmhat| / denom;
  //   update = ratio + wd p: + u |wd p| + u |update|;  p' = p - lr update: lr |dupdate| +
  //   u |lr update| + u |p'|.
  const double b1 = h.beta1, b2 = h.beta2, gs = h.gs, lr = h.lr, wd = h.wd, eps = h.eps;
  const double inv_bc1 = 1.0 / (1.0 - std::pow(b1, static_cast<double>(step)));
  const double inv_bc2 = 1.0 / (1.0 - std::pow(b2, static_cast<double>(step)));
  std::vector<double> bp(static_cast<std::size_t>(n)), bm(bp.size()), bv(bp.size());
  for (std::int64_t i = 0; i < n; ++i) {
    const double gg = g.get(i) * gs;
    const double mm = m64.get(i), vv = v64.get(i), pv = p0.get(i);
    const double big_m = std::fabs(b1 * m0.get(i)) + std::fabs((1 - b1) * gg);
    const double denom = std::sqrt(vv * inv_bc2) + eps;
    const double ratio = mm * inv_bc1 / denom;
    const double update = ratio + wd * pv;
    const double d_update = std::fabs(ratio) * 6.5 * kU +
                            inv_bc1 * (3 * kU * big_m + 2 * kU * std::fabs(mm)) / denom +
                            kU * std::fabs(wd * pv) + kU * std::fabs(update);
    const auto k = static_cast<std::size_t>(i);
    bp[k] = lr * d_update + kU * std::fabs(lr * update) + kU * std::fabs(p64.get(i));
    bm[k] = 3 * kU * big_m;
    bv[k] = 5 * kU * vv;
  }
  auto within = [](const HostTensor& got, const HostTensor& want, const std::vector<double>& b) {
    for (std::int64_t i = 0; i < got.numel(); ++i) {
      const double err = std::fabs(got.get(i) - want.get(i));
      if (!(err <= b[static_cast<std::size_t>(i)]))
        return ::testing::AssertionFailure()
               << "element " << i << ": got " << got.get(i) << " want " << want.get(i) << " bound "
               << b[static_cast<std::size_t>(i)];
    }
    return ::testing::AssertionSuccess();
  };
  EXPECT_TRUE(within(p, p64, bp));
  EXPECT_TRUE(within(m, m64, bm));
  EXPECT_TRUE(within(v, v64, bv));
}

TEST(AdamWStep, CpuMatchesReferenceOnSweptSizes) {
  std::uint64_t seed = 1;
  for (std::int64_t n : {1, 7, 13, 17, 33, 97, 129})
    for (std::int64_t step : {1, 2, 1000}) run_cpu_vs_ref(n, step, seed += 10);
  run_cpu_vs_ref(100003, 3, 999);  // large: split across threads, odd tail
}

TEST(AdamWStep, Bf16WriteOutEqualsRoundedParamBitForBit) {
  // lr = 0 leaves a finite p unchanged (p - 0 * finite = p), so the bf16 copy must be
  // f32_to_bf16(p) of these hand-picked patterns: ties to even (down, up), the largest float
  // (rounds to +inf), -0, a denormal and a NaN (NaN - 0 * NaN keeps p's payload on x86); plus
  // random values, 37 in all (SIMD body and tail). (+inf is not used: wd * inf with wd = 0 is NaN.)
  const std::vector<std::uint32_t> special = {0x3f808000u, 0x3f818000u, 0x7f7fffffu,
                                              0x80000000u, 0x00000001u, 0x7fc00001u};
  const std::int64_t n = 37;
  HostTensor p = random_tensor({n}, DType::kF32, 5, -3, 3);
  for (std::size_t i = 0; i < special.size(); ++i) {
    float f;
    std::memcpy(&f, &special[i], 4);
    static_cast<float*>(p.data())[i + 20] = f;  // lands in the second 16-wide block and tail
  }
  HostTensor m = zeros({n}, DType::kF32), v = zeros({n}, DType::kF32);
  const HostTensor g = zeros({n}, DType::kF32);
  HostTensor p16 = zeros({n}, DType::kBF16);
  const HostTensor before = p;
  AdamWArgs args = make_args(p, m, v, g, Hyper{.lr = 0.0f, .wd = 0.0f}, 1);
  args.param_bf16 = p16.view();
  FERRY_ASSERT_OK(cpu_backend().adamw(args, host()));
  const auto* pf = static_cast<const float*>(p.data());
  const auto* bits = static_cast<const std::uint16_t*>(p16.data());
  for (std::int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(std::memcmp(&pf[i], static_cast<const float*>(before.data()) + i, 4), 0) << i;
    EXPECT_EQ(bits[i], f32_to_bf16(pf[i])) << "element " << i;
  }
  // And after a real update, over a larger span: still exactly f32_to_bf16 of the new param.
  HostTensor q = random_tensor({1000}, DType::kF32, 6), qm = zeros({1000}, DType::kF32),
             qv = zeros({1000}, DType::kF32), q16 = zeros({1000}, DType::kBF16);
  const HostTensor qg = random_tensor({1000}, DType::kF32, 7);
  AdamWArgs qa = make_args(q, qm, qv, qg, Hyper{}, 1);
  qa.param_bf16 = q16.view();
  FERRY_ASSERT_OK(cpu_backend().adamw(qa, host()));
  for (std::int64_t i = 0; i < 1000; ++i)
    ASSERT_EQ(static_cast<const std::uint16_t*>(q16.data())[i],
              f32_to_bf16(static_cast<const float*>(q.data())[i]))
        << "element " << i;
}

TEST(AdamWStep, RejectsBadArguments) {
  HostTensor p = zeros({3}, DType::kF32), m = zeros({3}, DType::kF32), v = zeros({3}, DType::kF32);
  const HostTensor g = zeros({3}, DType::kF32);
  Status s = cpu_backend().adamw(make_args(p, m, v, g, Hyper{.beta1 = 1.0f}, 1), host());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  HostTensor g64 = zeros({3}, DType::kF64);
  s = cpu_backend().adamw(make_args(p, m, v, g64, Hyper{}, 1), host());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();
  HostTensor wrong16 = zeros({3}, DType::kF32);  // param_bf16 must be bf16
  AdamWArgs a = make_args(p, m, v, g, Hyper{}, 1);
  a.param_bf16 = wrong16.view();
  s = cpu_backend().adamw(a, host());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();
}

}  // namespace
}  // namespace ferry::kernels
