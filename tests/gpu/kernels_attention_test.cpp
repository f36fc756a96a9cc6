// SPDX-License-Identifier: Apache-2.0
// CUDA flash attention (forward + backward) vs the reference backend (f64), with the
// FlashAttention tolerance rule: err(cuda) <= 2 * err(naive bf16 attention) + atol, where the
// naive algorithm materialises S, P, dP, dS in bf16 (PyTorch's math path in bf16). Shapes sweep
// causal / non-causal, grouped-query, packed varlen with lengths 1, primes and non-multiples of
// the 64-row tiles, head dims 16, 32 (tiny models), 64 and 128. Determinism: bitwise repeatable,
// and a sequence's outputs do not depend on which other sequences are packed with it. D = 96 is
// unimplemented.
#include <cmath>

#include "tests/gpu/gpu_test_util.h"

namespace ferry::testing {
namespace {

using kernels::reference_backend;
constexpr DType kBf = DType::kBF16;
constexpr DType kF64 = DType::kF64;
constexpr DType kF32 = DType::kF32;

float rb(float x) { return bf16_to_f32(f32_to_bf16(x)); }

struct Case {
  std::vector<std::int64_t> lens;
  std::int64_t h, g, d;
  bool causal;
};

// Naive bf16 attention forward + backward, per sequence and head (see the file comment).
void naive_attention(const Case& c, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                     const HostTensor& dout, HostTensor& out, HostTensor& dq, HostTensor& dk,
                     HostTensor& dv) {
  const std::int64_t h = c.h, g = c.g, d = c.d, grp = h / g;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> dk_acc(static_cast<std::size_t>(dk.numel()), 0.0f), dv_acc(dk_acc);
  std::int64_t s0 = 0;
  for (std::int64_t len : c.lens) {
    for (std::int64_t hh = 0; hh < h; ++hh) {
      const std::int64_t kv = hh / grp;
      auto qa = [&](std::int64_t i, std::int64_t x) {
        return static_cast<float>(q.get(((s0 + i) * h + hh) * d + x));
      };
      auto ka = [&](std::int64_t j, std::int64_t x) {
        return static_cast<float>(k.get(((s0 + j) * g + kv) * d + x));
      };
      auto va = [&](std::int64_t j, std::int64_t x) {
        return static_cast<float>(v.get(((s0 + j) * g + kv) * d + x));
      };
      auto da = [&](std::int64_t i, std::int64_t x) {
        return static_cast<float>(dout.get(((s0 + i) * h + hh) * d + x));
      };
      std::vector<float> p(static_cast<std::size_t>(len * len), 0.0f), ds(p);
      for (std::int64_t i = 0; i < len; ++i) {
        const std::int64_t jend = c.causal ? i + 1 : len;
        float mx = -INFINITY;
        std::vector<float> srow(static_cast<std::size_t>(jend));
        for (std::int64_t j = 0; j < jend; ++j) {
          float acc = 0.0f;
          for (std::int64_t x = 0; x < d; ++x) acc += qa(i, x) * ka(j, x);
          srow[j] = rb(acc) * scale;
          mx = std::max(mx, srow[j]);
        }
        float sum = 0.0f;
        for (std::int64_t j = 0; j < jend; ++j) sum += std::exp(srow[j] - mx);
        for (std::int64_t j = 0; j < jend; ++j) p[i * len + j] = rb(std::exp(srow[j] - mx) / sum);
        for (std::int64_t x = 0; x < d; ++x) {
          float acc = 0.0f;
          for (std::int64_t j = 0; j < jend; ++j) acc += p[i * len + j] * va(j, x);
          out.set(((s0 + i) * h + hh) * d + x, rb(acc));
        }
        // dP, D, dS
        std::vector<float> dp(static_cast<std::size_t>(jend));
        float dsum = 0.0f;
        for (std::int64_t j = 0; j < jend; ++j) {
          float acc = 0.0f;
          for (std::int64_t x = 0; x < d; ++x) acc += da(i, x) * va(j, x);
          dp[j] = rb(acc);
          dsum += p[i * len + j] * dp[j];
        }
        for (std::int64_t j = 0; j < jend; ++j)
          ds[i * len + j] = rb(p[i * len + j] * (dp[j] - dsum));
      }
      for (std::int64_t i = 0; i < len; ++i)
        for (std::int64_t x = 0; x < d; ++x) {
          float acc = 0.0f;
          for (std::int64_t j = 0; j < len; ++j) acc += ds[i * len + j] * ka(j, x);
          dq.set(((s0 + i) * h + hh) * d + x, rb(acc * scale));
        }
      for (std::int64_t j = 0; j < len; ++j)
        for (std::int64_t x = 0; x < d; ++x) {
          float ak = 0.0f, av = 0.0f;
          for (std::int64_t i = 0; i < len; ++i) {
            ak += ds[i * len + j] * qa(i, x);
            av += p[i * len + j] * da(i, x);
          }
          dk_acc[static_cast<std::size_t>(((s0 + j) * g + kv) * d + x)] += rb(ak * scale);
          dv_acc[static_cast<std::size_t>(((s0 + j) * g + kv) * d + x)] += rb(av);
        }
    }
    s0 += len;
  }
  for (std::int64_t i = 0; i < dk.numel(); ++i) {
    dk.set(i, rb(dk_acc[static_cast<std::size_t>(i)]));
    dv.set(i, rb(dv_acc[static_cast<std::size_t>(i)]));
  }
}

HostTensor cu_of(const std::vector<std::int64_t>& lens) {
  HostTensor cu({static_cast<std::int64_t>(lens.size()) + 1}, DType::kI32);
  std::int64_t acc = 0;
  cu.set(0, 0);
  for (std::size_t i = 0; i < lens.size(); ++i)
    cu.set(static_cast<std::int64_t>(i) + 1, static_cast<double>(acc += lens[i]));
  return cu;
}

class KernelsAttention : public CudaTest {};

TEST_F(KernelsAttention, ForwardBackwardWithinTwiceNaiveBf16) {
  const Case cases[] = {{{1}, 1, 1, 64, true},          {{17, 64, 130}, 4, 2, 64, true},
                        {{200}, 2, 1, 128, false},      {{5, 129, 77}, 4, 4, 128, true},
                        {{256}, 8, 2, 128, true},       {{300, 70}, 16, 2, 128, true},
                        {{7, 23, 100}, 4, 2, 16, true}, {{65, 1}, 4, 1, 32, true},
                        {{90}, 2, 2, 32, false}};
  for (const Case& c : cases) {
    std::int64_t t = 0;
    for (auto l : c.lens) t += l;
    const std::uint64_t seed = static_cast<std::uint64_t>(t * 31 + c.h * 7 + c.d);
    const auto q = random_tensor({t, c.h, c.d}, kBf, seed, -2, 2),
               k = random_tensor({t, c.g, c.d}, kBf, seed + 1, -2, 2),
               v = random_tensor({t, c.g, c.d}, kBf, seed + 2),
               dout = random_tensor({t, c.h, c.d}, kBf, seed + 3);
    const auto cu = cu_of(c.lens);
    const auto q64 = converted(q, kF64), k64 = converted(k, kF64), v64 = converted(v, kF64),
               do64 = converted(dout, kF64);
    HostTensor out_w({t, c.h, c.d}, kF64), lse_w({c.h, t}, kF32), dq_w({t, c.h, c.d}, kF64),
        dk_w({t, c.g, c.d}, kF64), dv_w({t, c.g, c.d}, kF64);
    FERRY_ASSERT_OK(reference_backend().attention({.out = out_w.view(),
                                                   .lse = lse_w.view(),
                                                   .q = q64.cview(),
                                                   .k = k64.cview(),
                                                   .v = v64.cview(),
                                                   .cu_seqlens = cu.cview(),
                                                   .causal = c.causal},
                                                  mem::Stream::host()));
    FERRY_ASSERT_OK(reference_backend().attention_backward({.d_q = dq_w.view(),
                                                            .d_k = dk_w.view(),
                                                            .d_v = dv_w.view(),
                                                            .d_out = do64.cview(),
                                                            .q = q64.cview(),
                                                            .k = k64.cview(),
                                                            .v = v64.cview(),
                                                            .out = out_w.cview(),
                                                            .lse = lse_w.cview(),
                                                            .cu_seqlens = cu.cview(),
                                                            .causal = c.causal},
                                                           mem::Stream::host()));
    HostTensor out_n({t, c.h, c.d}, kF64), dq_n({t, c.h, c.d}, kF64), dk_n({t, c.g, c.d}, kF64),
        dv_n({t, c.g, c.d}, kF64);
    naive_attention(c, q, k, v, dout, out_n, dq_n, dk_n, dv_n);

    DeviceTensor dq(q), dk(k), dv(v), ddo(dout), dcu(cu),
        dout_c(std::vector<std::int64_t>{t, c.h, c.d}, kBf),
        dlse(std::vector<std::int64_t>{c.h, t}, kF32);
    DeviceTensor gq(std::vector<std::int64_t>{t, c.h, c.d}, kBf),
        gk(std::vector<std::int64_t>{t, c.g, c.d}, kBf),
        gv(std::vector<std::int64_t>{t, c.g, c.d}, kBf);
    FERRY_ASSERT_OK(cuda().attention({.out = dout_c.view(),
                                      .lse = dlse.view(),
                                      .q = dq.cview(),
                                      .k = dk.cview(),
                                      .v = dv.cview(),
                                      .cu_seqlens = dcu.cview(),
                                      .causal = c.causal},
                                     stream()));
    const kernels::AttentionBackwardArgs ba{.d_q = gq.view(),
                                            .d_k = gk.view(),
                                            .d_v = gv.view(),
                                            .d_out = ddo.cview(),
                                            .q = dq.cview(),
                                            .k = dk.cview(),
                                            .v = dv.cview(),
                                            .out = dout_c.cview(),
                                            .lse = dlse.cview(),
                                            .cu_seqlens = dcu.cview(),
                                            .causal = c.causal};
    FERRY_ASSERT_OK(cuda().attention_backward(ba, stream()));
    sync();
    const std::string what = "t=" + std::to_string(t) + " h=" + std::to_string(c.h) +
                             " g=" + std::to_string(c.g) + " d=" + std::to_string(c.d) +
                             " causal=" + std::to_string(c.causal);
    EXPECT_TRUE(within_twice_naive(dout_c.download(), out_w, out_n, 1e-3)) << "out " << what;
    EXPECT_LE(max_abs_diff(dlse.download(), lse_w), 1e-4 * (max_abs(lse_w) + 1.0))
        << "lse " << what;
    const auto gq1 = gq.download(), gk1 = gk.download(), gv1 = gv.download();
    EXPECT_TRUE(within_twice_naive(gq1, dq_w, dq_n, 1e-3)) << "dq " << what;
    EXPECT_TRUE(within_twice_naive(gk1, dk_w, dk_n, 1e-3)) << "dk " << what;
    EXPECT_TRUE(within_twice_naive(gv1, dv_w, dv_n, 1e-3)) << "dv " << what;
    // Determinism: the backward again gives the same bits.
    FERRY_ASSERT_OK(cuda().attention_backward(ba, stream()));
    sync();
    EXPECT_TRUE(same_bits(gq1, gq.download())) << what;
    EXPECT_TRUE(same_bits(gk1, gk.download())) << what;
    EXPECT_TRUE(same_bits(gv1, gv.download())) << what;

    // The workspace path (dK/dV per query-head slice, partials added in slice order): the full
    // workspace (one slice per query head) and a quarter of it (fewer, larger slices).
    const std::size_t full = cuda().workspace_bytes(ba);
    ASSERT_EQ(full, static_cast<std::size_t>(2 * t * c.h * c.d) * sizeof(float));
    for (std::size_t bytes : {full, full / 4}) {
      DeviceTensor ws(std::vector<std::int64_t>{static_cast<std::int64_t>(bytes)}, DType::kU8);
      kernels::AttentionBackwardArgs bw = ba;
      bw.workspace = ws.view();
      FERRY_ASSERT_OK(cuda().attention_backward(bw, stream()));
      sync();
      const std::string w = what + " workspace=" + std::to_string(bytes);
      const auto wq = gq.download(), wk = gk.download(), wv = gv.download();
      EXPECT_TRUE(same_bits(gq1, wq)) << "dq does not use the workspace " << w;
      EXPECT_TRUE(within_twice_naive(wk, dk_w, dk_n, 1e-3)) << "dk " << w;
      EXPECT_TRUE(within_twice_naive(wv, dv_w, dv_n, 1e-3)) << "dv " << w;
      FERRY_ASSERT_OK(cuda().attention_backward(bw, stream()));
      sync();
      EXPECT_TRUE(same_bits(wk, gk.download())) << w;
      EXPECT_TRUE(same_bits(wv, gv.download())) << w;
    }
  }
}

TEST_F(KernelsAttention, SequenceResultDoesNotDependOnPacking) {
  const std::int64_t la = 100, lb = 157, h = 4, g = 2, d = 128, t = la + lb;
  const auto q = random_tensor({t, h, d}, kBf, 1), k = random_tensor({t, g, d}, kBf, 2),
             v = random_tensor({t, g, d}, kBf, 3);
  DeviceTensor dq(q), dk(k), dv(v), cu2(cu_of({la, lb})), cu1(cu_of({la})),
      o2(std::vector<std::int64_t>{t, h, d}, kBf);
  DeviceTensor o1(std::vector<std::int64_t>{la, h, d}, kBf);
  FERRY_ASSERT_OK(cuda().attention({.out = o2.view(),
                                    .q = dq.cview(),
                                    .k = dk.cview(),
                                    .v = dv.cview(),
                                    .cu_seqlens = cu2.cview()},
                                   stream()));
  auto head = [&](const DeviceTensor& x) {
    ConstTensorView cv = x.cview();
    cv.shape[0] = la;
    return cv;
  };
  TensorView o1v = o1.view();
  FERRY_ASSERT_OK(cuda().attention(
      {.out = o1v, .q = head(dq), .k = head(dk), .v = head(dv), .cu_seqlens = cu1.cview()},
      stream()));
  sync();
  const auto a = o1.download(), b = o2.download();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), static_cast<std::size_t>(la * h * d) * 2), 0);
}

TEST_F(KernelsAttention, UnsupportedHeadDimIsUnimplemented) {
  DeviceTensor q(std::vector<std::int64_t>{4, 1, 96}, kBf),
      o(std::vector<std::int64_t>{4, 1, 96}, kBf), cu(cu_of({4}));
  const auto s = cuda().attention(
      {.out = o.view(), .q = q.cview(), .k = q.cview(), .v = q.cview(), .cu_seqlens = cu.cview()},
      stream());
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();
}

}  // namespace
}  // namespace ferry::testing
