// SPDX-License-Identifier: Apache-2.0
// Attention forward/backward: a hand-computed case, finite-difference gradients of the f64
// reference, packed == per-sequence, causality, bad inputs, and the CPU backend against the f64
// reference under the FlashAttention rule
//   err(cpu) <= 2 * err(naive f32) + atol,  both measured against the f64 reference,
// where "naive f32" is the textbook two-pass softmax with the full score row, in float, below.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <ostream>
#include <vector>

#include "kernels/backend.h"
#include "mem/stream.h"
#include "unit/kernels/kernel_test_util.h"

namespace ferry::kernels {
namespace {

using testing::HostTensor;

struct Pack {
  std::vector<std::int64_t> lens;
  std::int64_t H, G, D;
  std::int64_t T() const { return std::accumulate(lens.begin(), lens.end(), std::int64_t{0}); }
  HostTensor cu() const {
    HostTensor c({static_cast<std::int64_t>(lens.size()) + 1}, DType::kI32);
    std::int64_t s = 0;
    c.set(0, 0);
    for (std::size_t i = 0; i < lens.size(); ++i)
      c.set(static_cast<std::int64_t>(i) + 1, s += lens[i]);
    return c;
  }
};

struct Inputs {
  HostTensor q, k, v, cu;
};

Inputs make_inputs(const Pack& p, DType dt, std::uint64_t seed) {
  return {testing::random_tensor({p.T(), p.H, p.D}, dt, seed),
          testing::random_tensor({p.T(), p.G, p.D}, dt, seed + 1),
          testing::random_tensor({p.T(), p.G, p.D}, dt, seed + 2), p.cu()};
}

Status forward(Backend& be, const Inputs& in, HostTensor& out, HostTensor& lse, bool causal = true,
               float scale = 0.0f) {
  AttentionArgs a;
  a.out = out.view();
  a.lse = lse.view();
  a.q = in.q.cview();
  a.k = in.k.cview();
  a.v = in.v.cview();
  a.cu_seqlens = in.cu.cview();
  a.scale = scale;
  a.causal = causal;
  return be.attention(a, mem::Stream::host());
}

Status backward(Backend& be, const Inputs& in, const HostTensor& out, const HostTensor& lse,
                const HostTensor& d_out, HostTensor& dq, HostTensor& dk, HostTensor& dv,
                bool causal = true) {
  AttentionBackwardArgs a;
  a.d_q = dq.view();
  a.d_k = dk.view();
  a.d_v = dv.view();
  a.d_out = d_out.cview();
  a.q = in.q.cview();
  a.k = in.k.cview();
  a.v = in.v.cview();
  a.out = out.cview();
  a.lse = lse.cview();
  a.cu_seqlens = in.cu.cview();
  a.causal = causal;
  return be.attention_backward(a, mem::Stream::host());
}

// Textbook attention in float: full score row, max, exp, sum, normalise; then the textbook
// backward from the materialised P. Independent of both backends' code.
struct NaiveF32 {
  std::vector<float> out, lse, dq, dk, dv;
};
NaiveF32 naive_f32(const Pack& p, const Inputs& in, const HostTensor& d_out, bool causal) {
  const std::int64_t T = p.T(), H = p.H, G = p.G, D = p.D, grp = H / G;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto q = [&](std::int64_t t, std::int64_t h, std::int64_t d) {
    return static_cast<float>(in.q.get((t * H + h) * D + d));
  };
  auto k = [&](std::int64_t t, std::int64_t g, std::int64_t d) {
    return static_cast<float>(in.k.get((t * G + g) * D + d));
  };
  auto v = [&](std::int64_t t, std::int64_t g, std::int64_t d) {
    return static_cast<float>(in.v.get((t * G + g) * D + d));
  };
  auto dO = [&](std::int64_t t, std::int64_t h, std::int64_t d) {
    return static_cast<float>(d_out.get((t * H + h) * D + d));
  };
  NaiveF32 r;
  r.out.assign(T * H * D, 0.0f);
  r.lse.assign(H * T, 0.0f);
  r.dq.assign(T * H * D, 0.0f);
  r.dk.assign(T * G * D, 0.0f);
  r.dv.assign(T * G * D, 0.0f);
  std::int64_t b = 0;
  for (std::int64_t len : p.lens) {
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / grp;
      for (std::int64_t i = b; i < b + len; ++i) {
        const std::int64_t je = causal ? i + 1 : b + len;
        std::vector<float> s(je - b), P(je - b);
        float m = -std::numeric_limits<float>::infinity();
        for (std::int64_t j = b; j < je; ++j) {
          float dot = 0.0f;
          for (std::int64_t d = 0; d < D; ++d) dot += q(i, h, d) * k(j, g, d);
          s[j - b] = scale * dot;
          m = std::max(m, s[j - b]);
        }
        float l = 0.0f;
        for (std::int64_t j = b; j < je; ++j) l += std::exp(s[j - b] - m);
        for (std::int64_t j = b; j < je; ++j) P[j - b] = std::exp(s[j - b] - m) / l;
        r.lse[h * T + i] = m + std::log(l);
        for (std::int64_t d = 0; d < D; ++d) {
          float o = 0.0f;
          for (std::int64_t j = b; j < je; ++j) o += P[j - b] * v(j, g, d);
          r.out[(i * H + h) * D + d] = o;
        }
        // backward for row i: dP_j = dO_i . v_j; dS = P (dP - sum_j P_j dP_j)
        std::vector<float> dP(je - b);
        float rowsum = 0.0f;
        for (std::int64_t j = b; j < je; ++j) {
          float dot = 0.0f;
          for (std::int64_t d = 0; d < D; ++d) dot += dO(i, h, d) * v(j, g, d);
          dP[j - b] = dot;
          rowsum += P[j - b] * dot;
        }
        for (std::int64_t j = b; j < je; ++j) {
          const float ds = P[j - b] * (dP[j - b] - rowsum);
          for (std::int64_t d = 0; d < D; ++d) {
            r.dq[(i * H + h) * D + d] += scale * ds * k(j, g, d);
            r.dk[(j * G + g) * D + d] += scale * ds * q(i, h, d);
            r.dv[(j * G + g) * D + d] += P[j - b] * dO(i, h, d);
          }
        }
      }
    }
    b += len;
  }
  return r;
}

double max_err(const std::vector<float>& got, const HostTensor& want) {
  double m = 0.0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    m = std::max(m, std::fabs(static_cast<double>(got[i]) - want.get(i)));
  }
  return m;
}
double max_err(const HostTensor& got, const HostTensor& want) {
  return testing::max_abs_diff(got, want);
}

// Hand-computed: T = 2, one sequence, H = G = 1, D = 1, scale 1, causal.
//   q = [1, 1], k = [0, ln 3], v = [4, 8].
//   row 0 sees key 0 only: s = 1*0 = 0 -> p = [1] -> out0 = 4, lse0 = log(e^0) = 0.
//   row 1: s = [0, ln 3] -> e^s = [1, 3], sum 4 -> p = [1/4, 3/4] -> out1 = 1 + 6 = 7,
//   lse1 = log 4.
TEST(Attention, HandComputedTwoTokens) {
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    const DType dt = be == &reference_backend() ? DType::kF64 : DType::kF32;
    Inputs in{testing::from_values({2, 1, 1}, dt, {1, 1}),
              testing::from_values({2, 1, 1}, dt, {0, std::log(3.0)}),
              testing::from_values({2, 1, 1}, dt, {4, 8}), Pack{{2}, 1, 1, 1}.cu()};
    HostTensor out({2, 1, 1}, dt), lse({1, 2}, dt);
    FERRY_ASSERT_OK(forward(*be, in, out, lse, true, 1.0f));
    const double tol = dt == DType::kF64 ? 1e-14 : 1e-6;
    EXPECT_NEAR(out.get(0), 4.0, tol) << be->name();
    EXPECT_NEAR(out.get(1), 7.0, tol) << be->name();
    EXPECT_NEAR(lse.get(0), 0.0, tol) << be->name();
    EXPECT_NEAR(lse.get(1), std::log(4.0), tol) << be->name();
  }
}

// Finite differences of L = sum(out * proj) in f64 against the reference backward.
void check_reference_gradients(const Pack& p, bool causal, std::uint64_t seed) {
  Backend& ref = reference_backend();
  Inputs in = make_inputs(p, DType::kF64, seed);
  const HostTensor proj = testing::random_tensor({p.T(), p.H, p.D}, DType::kF64, seed + 7);
  HostTensor out({p.T(), p.H, p.D}, DType::kF64), lse({p.H, p.T()}, DType::kF64);
  FERRY_ASSERT_OK(forward(ref, in, out, lse, causal));
  HostTensor dq({p.T(), p.H, p.D}, DType::kF64), dk({p.T(), p.G, p.D}, DType::kF64),
      dv({p.T(), p.G, p.D}, DType::kF64);
  FERRY_ASSERT_OK(backward(ref, in, out, lse, proj, dq, dk, dv, causal));
  HostTensor o2 = out, l2 = lse;
  auto loss = [&] {
    FERRY_CHECK_OK(forward(ref, in, o2, l2, causal));
    return testing::dot(o2, proj);
  };
  EXPECT_TRUE(testing::check_gradient(in.q, dq, loss)) << "d_q";
  EXPECT_TRUE(testing::check_gradient(in.k, dk, loss)) << "d_k";
  EXPECT_TRUE(testing::check_gradient(in.v, dv, loss)) << "d_v";
}

TEST(AttentionReference, GradientsMatchFiniteDifferencesMha) {
  check_reference_gradients({{3, 1, 4}, 2, 2, 3}, true, 11);
}
TEST(AttentionReference, GradientsMatchFiniteDifferencesGqa2) {
  check_reference_gradients({{5, 2}, 4, 2, 3}, true, 12);
}
TEST(AttentionReference, GradientsMatchFiniteDifferencesGqa4NonCausal) {
  check_reference_gradients({{4, 3}, 4, 1, 2}, false, 13);
}

// Each sequence of a pack only sees itself: running it alone gives the same bytes.
TEST(Attention, PackedEqualsSeparate) {
  const Pack p{{5, 1, 37, 2}, 4, 2, 8};
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    const Inputs in = make_inputs(p, DType::kF32, 21);
    HostTensor out({p.T(), p.H, p.D}, DType::kF32), lse({p.H, p.T()}, DType::kF32);
    FERRY_ASSERT_OK(forward(*be, in, out, lse));
    std::int64_t b = 0;
    for (std::int64_t len : p.lens) {
      const Pack one{{len}, p.H, p.G, p.D};
      Inputs sub{HostTensor({len, p.H, p.D}, DType::kF32), HostTensor({len, p.G, p.D}, DType::kF32),
                 HostTensor({len, p.G, p.D}, DType::kF32), one.cu()};
      for (std::int64_t i = 0; i < len * p.H * p.D; ++i) sub.q.set(i, in.q.get(b * p.H * p.D + i));
      for (std::int64_t i = 0; i < len * p.G * p.D; ++i) {
        sub.k.set(i, in.k.get(b * p.G * p.D + i));
        sub.v.set(i, in.v.get(b * p.G * p.D + i));
      }
      HostTensor o1({len, p.H, p.D}, DType::kF32), l1({p.H, len}, DType::kF32);
      FERRY_ASSERT_OK(forward(*be, sub, o1, l1));
      for (std::int64_t i = 0; i < len * p.H * p.D; ++i) {
        ASSERT_EQ(o1.get(i), out.get(b * p.H * p.D + i)) << be->name() << " seq at " << b;
      }
      for (std::int64_t h = 0; h < p.H; ++h) {
        for (std::int64_t t = 0; t < len; ++t) {
          ASSERT_EQ(l1.get(h * len + t), lse.get(h * p.T() + b + t)) << be->name();
        }
      }
      b += len;
    }
  }
}

// Changing token 6's q, k, v leaves rows 0..5 unchanged and changes row 6 onwards.
TEST(Attention, CausalityFutureTokensDoNotLeak) {
  const Pack p{{11}, 2, 1, 16};
  const std::int64_t changed = 6;
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    Inputs in = make_inputs(p, DType::kF32, 31);
    HostTensor out({p.T(), p.H, p.D}, DType::kF32), lse({p.H, p.T()}, DType::kF32);
    FERRY_ASSERT_OK(forward(*be, in, out, lse));
    for (std::int64_t i = 0; i < p.H * p.D; ++i) in.q.set(changed * p.H * p.D + i, 0.5);
    for (std::int64_t i = 0; i < p.G * p.D; ++i) {
      in.k.set(changed * p.G * p.D + i, -0.7);
      in.v.set(changed * p.G * p.D + i, 3.0);
    }
    HostTensor out2 = out, lse2 = lse;
    FERRY_ASSERT_OK(forward(*be, in, out2, lse2));
    const std::int64_t row = p.H * p.D;
    for (std::int64_t i = 0; i < changed * row; ++i) ASSERT_EQ(out.get(i), out2.get(i));
    for (std::int64_t t = changed; t < p.T(); ++t) {
      double diff = 0.0;
      for (std::int64_t i = 0; i < row; ++i)
        diff += std::fabs(out.get(t * row + i) - out2.get(t * row + i));
      EXPECT_GT(diff, 0.0) << be->name() << " row " << t << " ignored the changed token";
    }
  }
}

TEST(Attention, BadInputsReturnStatus) {
  const Pack p{{3, 2}, 4, 2, 8};
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    Inputs in = make_inputs(p, DType::kF32, 41);
    HostTensor out({p.T(), p.H, p.D}, DType::kF32), lse({p.H, p.T()}, DType::kF32);
    in.cu.set(2, 4);  // last entry != T
    EXPECT_EQ(forward(*be, in, out, lse).code(), StatusCode::kInvalidArgument) << be->name();
    in.cu.set(2, 5);
    in.cu.set(1, 6);  // decreasing
    EXPECT_EQ(forward(*be, in, out, lse).code(), StatusCode::kInvalidArgument) << be->name();
    in.cu.set(1, 3);
    Inputs bad_heads = in;
    bad_heads.k = testing::random_tensor({p.T(), 3, p.D}, DType::kF32, 1);  // 4 % 3 != 0
    bad_heads.v = bad_heads.k;
    EXPECT_EQ(forward(*be, bad_heads, out, lse).code(), StatusCode::kInvalidArgument);
    HostTensor small_lse({p.H, p.T() - 1}, DType::kF32);
    EXPECT_EQ(forward(*be, in, out, small_lse).code(), StatusCode::kInvalidArgument);
    FERRY_EXPECT_OK(forward(*be, in, out, lse));
  }
  // The CPU backend keeps per-item scratch on the stack: head dims above 256 are refused.
  const Pack wide{{2}, 1, 1, 257};
  const Inputs in = make_inputs(wide, DType::kF32, 42);
  HostTensor out({2, 1, 257}, DType::kF32), lse({1, 2}, DType::kF32);
  EXPECT_EQ(forward(cpu_backend(), in, out, lse).code(), StatusCode::kUnimplemented);
  const Inputs in64 = make_inputs(wide, DType::kF64, 42);
  HostTensor out64({2, 1, 257}, DType::kF64);
  EXPECT_EQ(forward(cpu_backend(), in64, out64, lse).code(), StatusCode::kUnimplemented);
}

// CPU vs f64 reference, FlashAttention rule, forward and backward.
struct SweepCase {
  std::vector<std::int64_t> lens;
  std::int64_t H, G, D;
  bool causal;
};

void PrintTo(const SweepCase& c, std::ostream* os) {
  *os << "lens={";
  for (std::size_t i = 0; i < c.lens.size(); ++i) *os << (i ? "," : "") << c.lens[i];
  *os << "} H=" << c.H << " G=" << c.G << " D=" << c.D << (c.causal ? " causal" : " full");
}

class AttentionCpuSweep : public ::testing::TestWithParam<SweepCase> {};

TEST_P(AttentionCpuSweep, WithinTwiceNaiveF32Error) {
  const SweepCase c = GetParam();
  const Pack p{c.lens, c.H, c.G, c.D};
  const std::int64_t T = p.T();
  const std::uint64_t seed = static_cast<std::uint64_t>(T * 131 + c.H * 17 + c.D);
  const Inputs in32 = make_inputs(p, DType::kF32, seed);
  const HostTensor d_out32 = testing::random_tensor({T, p.H, p.D}, DType::kF32, seed + 5);
  const Inputs in64{testing::converted(in32.q, DType::kF64),
                    testing::converted(in32.k, DType::kF64),
                    testing::converted(in32.v, DType::kF64), in32.cu};
  const HostTensor d_out64 = testing::converted(d_out32, DType::kF64);

  HostTensor want_out({T, p.H, p.D}, DType::kF64), want_lse({p.H, T}, DType::kF64);
  FERRY_ASSERT_OK(forward(reference_backend(), in64, want_out, want_lse, c.causal));
  HostTensor want_dq({T, p.H, p.D}, DType::kF64), want_dk({T, p.G, p.D}, DType::kF64),
      want_dv({T, p.G, p.D}, DType::kF64);
  FERRY_ASSERT_OK(backward(reference_backend(), in64, want_out, want_lse, d_out64, want_dq, want_dk,
                           want_dv, c.causal));

  HostTensor out({T, p.H, p.D}, DType::kF32), lse({p.H, T}, DType::kF32);
  FERRY_ASSERT_OK(forward(cpu_backend(), in32, out, lse, c.causal));
  HostTensor dq({T, p.H, p.D}, DType::kF32), dk({T, p.G, p.D}, DType::kF32),
      dv({T, p.G, p.D}, DType::kF32);
  FERRY_ASSERT_OK(backward(cpu_backend(), in32, out, lse, d_out32, dq, dk, dv, c.causal));

  const NaiveF32 naive = naive_f32(p, in32, d_out32, c.causal);
  // atol: 16 f32 unit roundoffs (16 * 2^-24 ~ 1e-6) at the O(1) magnitude of these tensors
  // (inputs uniform in [-1, 1]); it only matters where the naive error is ~0 (e.g. T = 1).
  const double atol = 16.0 * testing::eps_of(DType::kF32);
  const std::string what = "T=" + std::to_string(T) + " H=" + std::to_string(p.H) +
                           " G=" + std::to_string(p.G) + " D=" + std::to_string(p.D);
  EXPECT_LE(max_err(out, want_out), 2.0 * max_err(naive.out, want_out) + atol) << what;
  EXPECT_LE(max_err(lse, want_lse), 2.0 * max_err(naive.lse, want_lse) + atol) << what;
  EXPECT_LE(max_err(dq, want_dq), 2.0 * max_err(naive.dq, want_dq) + atol) << what;
  EXPECT_LE(max_err(dk, want_dk), 2.0 * max_err(naive.dk, want_dk) + atol) << what;
  EXPECT_LE(max_err(dv, want_dv), 2.0 * max_err(naive.dv, want_dv) + atol) << what;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionCpuSweep,
    ::testing::Values(SweepCase{{1}, 1, 1, 8, true}, SweepCase{{7}, 2, 2, 16, true},
                      SweepCase{{13, 1, 5}, 4, 2, 8, true}, SweepCase{{67, 2}, 4, 1, 16, true},
                      SweepCase{{31, 97}, 2, 1, 64, true}, SweepCase{{1, 1, 1}, 4, 4, 5, true},
                      SweepCase{{29, 3}, 4, 2, 5, false}, SweepCase{{70}, 2, 2, 64, false},
                      SweepCase{{0, 6, 0}, 2, 1, 8, true}));

}  // namespace
}  // namespace ferry::kernels
