// SPDX-License-Identifier: Apache-2.0
// The CPU backend's SIMD span kernels (kernels/cpu/simd_kernels.h): every variant this machine
// supports (AVX-512, AVX2) must give the same bits as the scalar function, on lengths that
// exercise empty bodies, exact blocks and every tail length; and the shared exp polynomial
// (simd_math.h) must stay within 3 u of exp on its whole clamped range, which is what the swiglu
// tolerance in dense_cpu_vs_ref_test.cpp relies on.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/simd_kernels.h"
#include "kernels/cpu/simd_math.h"
#include "unit/kernels/kernel_test_util.h"

namespace ferry::kernels::cpu {
namespace {

using testing::HostTensor;
using testing::random_tensor;

std::vector<Isa> simd_variants() {
  std::vector<Isa> v;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    if (isa_supported(isa)) v.push_back(isa);
  return v;
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * 4) == 0;
}
float* f(HostTensor& t) { return static_cast<float*>(t.data()); }
const float* cf(const HostTensor& t) { return static_cast<const float*>(t.data()); }

std::vector<std::int64_t> lengths() {
  std::vector<std::int64_t> n;
  for (std::int64_t i = 1; i <= 49; ++i) n.push_back(i);
  n.push_back(1031);
  return n;
}

TEST(CpuSimd, ExpPolynomialWithinThreeUlpOfExp) {
  // u = 2^-24; the bound covers the degree-7 Taylor truncation (< 0.1 u), 8 Horner steps
  // around values in [0.7, 1.5], and the final scaling. Checked on a dense grid of [-87, 88].
  double worst = 0.0;
  for (double x = -87.0; x <= 88.0; x += 0.000731) {
    const auto xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    worst = std::max(worst, std::fabs(simd::exp_f32(xf) - want) / want);
  }
  EXPECT_LE(worst, 3.0 * 0x1p-24);
}

TEST(CpuSimd, RmsNormRowVariantsMatchScalarBits) {
  if (simd_variants().empty()) GTEST_SKIP() << "no AVX2/AVX-512 on this CPU";
  for (std::int64_t c : lengths()) {
    const HostTensor x = random_tensor({c}, DType::kF32, 10 + c, -2, 2);
    const HostTensor w = random_tensor({c}, DType::kF32, 20 + c);
    const HostTensor dy = random_tensor({c}, DType::kF32, 30 + c);
    HostTensor y0({c}, DType::kF32), dx0({c}, DType::kF32);
    const float r0 = rms_norm_row(Isa::kScalar, f(y0), cf(x), cf(w), c, 1e-6f);
    rms_norm_backward_row(Isa::kScalar, f(dx0), cf(dy), cf(x), cf(w), r0, c);
    for (Isa isa : simd_variants()) {
      HostTensor y({c}, DType::kF32), dx({c}, DType::kF32);
      const float r = rms_norm_row(isa, f(y), cf(x), cf(w), c, 1e-6f);
      rms_norm_backward_row(isa, f(dx), cf(dy), cf(x), cf(w), r0, c);
      EXPECT_EQ(std::memcmp(&r, &r0, 4), 0) << to_string(isa) << " c=" << c;
      EXPECT_TRUE(same_bits(y, y0)) << to_string(isa) << " c=" << c;
      EXPECT_TRUE(same_bits(dx, dx0)) << to_string(isa) << " c=" << c;
    }
  }
}

TEST(CpuSimd, SwiGluVariantsMatchScalarBits) {
  if (simd_variants().empty()) GTEST_SKIP() << "no AVX2/AVX-512 on this CPU";
  for (std::int64_t n : lengths()) {
    // Gates span the clamp region too (|g| up to 120 > 88).
    const HostTensor g = random_tensor({n}, DType::kF32, 40 + n, -120, 120);
    const HostTensor u = random_tensor({n}, DType::kF32, 50 + n);
    const HostTensor dy = random_tensor({n}, DType::kF32, 60 + n);
    HostTensor o0({n}, DType::kF32), dg0({n}, DType::kF32), du0({n}, DType::kF32);
    swiglu_span(Isa::kScalar, f(o0), cf(g), cf(u), n);
    swiglu_backward_span(Isa::kScalar, f(dg0), f(du0), cf(dy), cf(g), cf(u), n);
    for (Isa isa : simd_variants()) {
      HostTensor o({n}, DType::kF32), dg({n}, DType::kF32), du({n}, DType::kF32);
      swiglu_span(isa, f(o), cf(g), cf(u), n);
      swiglu_backward_span(isa, f(dg), f(du), cf(dy), cf(g), cf(u), n);
      EXPECT_TRUE(same_bits(o, o0)) << to_string(isa) << " n=" << n;
      EXPECT_TRUE(same_bits(dg, dg0)) << to_string(isa) << " n=" << n;
      EXPECT_TRUE(same_bits(du, du0)) << to_string(isa) << " n=" << n;
    }
  }
}

TEST(CpuSimd, AdamWVariantsMatchScalarBits) {
  if (simd_variants().empty()) GTEST_SKIP() << "no AVX2/AVX-512 on this CPU";
  const AdamWConstants k = make_adamw_constants(1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.8f, 7);
  for (std::int64_t n : lengths()) {
    const HostTensor p_init = random_tensor({n}, DType::kF32, 70 + n);
    const HostTensor m_init = random_tensor({n}, DType::kF32, 80 + n, -0.1, 0.1);
    const HostTensor v_init = random_tensor({n}, DType::kF32, 90 + n, 0, 0.01);
    const HostTensor g = random_tensor({n}, DType::kF32, 100 + n);
    HostTensor p0 = p_init, m0 = m_init, v0 = v_init, b0({n}, DType::kBF16);
    adamw_span(Isa::kScalar, k, f(p0), f(m0), f(v0), static_cast<std::uint16_t*>(b0.data()), cf(g),
               n);
    for (Isa isa : simd_variants()) {
      HostTensor p = p_init, m = m_init, v = v_init, b({n}, DType::kBF16);
      adamw_span(isa, k, f(p), f(m), f(v), static_cast<std::uint16_t*>(b.data()), cf(g), n);
      EXPECT_TRUE(same_bits(p, p0)) << to_string(isa) << " n=" << n;
      EXPECT_TRUE(same_bits(m, m0)) << to_string(isa) << " n=" << n;
      EXPECT_TRUE(same_bits(v, v0)) << to_string(isa) << " n=" << n;
      EXPECT_EQ(std::memcmp(b.data(), b0.data(), static_cast<std::size_t>(n) * 2), 0)
          << to_string(isa) << " n=" << n;
    }
  }
}

}  // namespace
}  // namespace ferry::kernels::cpu
