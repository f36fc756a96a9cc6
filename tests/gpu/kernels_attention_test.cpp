// SPDX-License-Identifier: Apache-2.0
// CUDA flash attention (forward + backward) vs the reference backend (f64), with the
// FlashAttention tolerance rule: err(cuda) <= 2 * err(naive bf16 attention) + atol, where the
// naive algorithm materialises S, P, dP, dS in bf16 (PyTorch's math path in bf16). Shapes sweep
// causal / non-causal, grouped-query, packed varlen with lengths 1, primes and non-multiples of
// the 64-row tiles, head dims 16, 32 (tiny models), 64 and 128. Determinism: bitwise repeatable,
// and a sequence's outputs do not depend on which other sequences are packed with it. D = 96 is
// unimplemented. Every kernel variant runs (the launchers read FERRY_ATTN_FWD_MT,
// FERRY_ATTN_FWD_QREGS, FERRY_ATTN_FWD_LAZY, FERRY_ATTN_FWD_WGMMA,
// FERRY_ATTN_BWD_DQ and FERRY_ATTN_BWD_WGMMA at each launch; kVariants below; on sm_90a the
// default forward and backward are the warpgroup-MMA kernels). Long sequences (S up to 4096, GQA
// 16/2 and 28/4) are checked on sampled rows against f64 row computations
// (LongSequencesSampledRows), since the full reference is O(S^2) per head on the CPU. The atomic-dQ
// backward (FERRY_ATTN_BWD_DQ=atomic, D = 64 / 128, with a workspace) is not bitwise repeatable in
// dQ: its dQ is held to the tolerance rule instead, and its dK / dV must have the deterministic
// path's bits (AtomicDqMatchesDeterministicPath).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "kernels/cuda/launchers.h"
#include "scoped_env.h"
#include "tests/gpu/gpu_test_util.h"

namespace ferry::testing {
namespace {

using kernels::reference_backend;
constexpr DType kBf = DType::kBF16;
constexpr DType kF64 = DType::kF64;
constexpr DType kF32 = DType::kF32;

float rb(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// The kernel variants (attention_fwd.cu / attention_bwd.cu), selected through the environment.
struct Variant {
  const char* name;
  const char* fwd_mt;               // FERRY_ATTN_FWD_MT
  const char* fwd_qregs;            // FERRY_ATTN_FWD_QREGS
  const char* bwd_dq;               // FERRY_ATTN_BWD_DQ
  const char* fwd_lazy = nullptr;   // FERRY_ATTN_FWD_LAZY: conditional rescale ("64": 64-key tiles)
  const char* bwd_wgmma = nullptr;  // FERRY_ATTN_BWD_WGMMA ("0": the mma.sync backward kernels)
  const char* fwd_wgmma = nullptr;  // FERRY_ATTN_FWD_WGMMA ("0": the mma.sync forward)
};
constexpr Variant kVariants[] = {
    {"default (sm_90a: warpgroup-MMA fwd and bwd; else fwd lazy rescale, Q from smem, 64-key "
     "tiles at D=128, dK/dV 16 keys/warp)",
     nullptr, nullptr, nullptr},
    {"fwd eager rescale, 32-key tiles (the default before session 27)", nullptr, nullptr, nullptr,
     "0"},
    {"fwd eager, Q in registers, dK/dV 16 keys/warp (mma.sync)", nullptr, "1", nullptr, "0", "0"},
    // (a "dK/dV 32 keys/warp" variant ran here until its kernel was removed in session 31)
    {"fwd 16 rows/warp, dK/dV 16 keys/warp (mma.sync)", "1", nullptr, nullptr, nullptr, "0"},
    {"atomic dQ (fused dK/dV/dQ kernel when it has a workspace)", nullptr, nullptr, "atomic"},
    {"fwd lazy rescale, 32-key tiles", nullptr, nullptr, nullptr, "1"},
    {"fwd lazy rescale, Q in registers", nullptr, "1", nullptr, "1"},
    {"fwd eager rescale, 16 rows/warp", "1", nullptr, nullptr, "0"},
    // The backward's mma.sync kernels where the default is the warpgroup-MMA one (sm_90a;
    // ForwardBackwardWithinTwiceNaiveBf16 prints which runs by default here).
    {"dK/dV and dQ mma.sync (FERRY_ATTN_BWD_WGMMA=0)", nullptr, nullptr, nullptr, nullptr, "0"},
    // The mma.sync forward that is the default where the warpgroup-MMA one cannot run.
    {"fwd mma.sync lazy, 64-key tiles (FERRY_ATTN_FWD_WGMMA=0)", nullptr, nullptr, nullptr, nullptr,
     nullptr, "0"},
};
// Whether the variant runs the default forward (it switches only the backward).
bool default_forward(const Variant& v) {
  return v.fwd_mt == nullptr && v.fwd_qregs == nullptr && v.fwd_lazy == nullptr &&
         v.fwd_wgmma == nullptr;
}
struct ScopedVariant {
  explicit ScopedVariant(const Variant& v)
      : mt("FERRY_ATTN_FWD_MT", v.fwd_mt),
        qregs("FERRY_ATTN_FWD_QREGS", v.fwd_qregs),
        dq("FERRY_ATTN_BWD_DQ", v.bwd_dq),
        lazy("FERRY_ATTN_FWD_LAZY", v.fwd_lazy),
        wgmma("FERRY_ATTN_BWD_WGMMA", v.bwd_wgmma),
        fwd_wgmma("FERRY_ATTN_FWD_WGMMA", v.fwd_wgmma) {}
  ScopedEnv mt, qregs, dq, lazy, wgmma, fwd_wgmma;
};

// Whether the variant's backward runs the atomic-dQ kernel at head dim d given enough workspace
// (attention_bwd.cu: D = 64 / 128; other D take the deterministic path).
bool atomic_dq(const Variant& v, std::int64_t d) {
  return v.bwd_dq != nullptr && (d == 64 || d == 128);
}
// The atomic path's part of the workspace (attention_bwd.cu): the f32 dQ accumulator [T, H, D] and
// dsum [H, T] (padded to 4 floats), in front of the dK/dV partials. Less than this: deterministic.
std::size_t atomic_dq_bytes(std::int64_t t, std::int64_t h, std::int64_t d) {
  return static_cast<std::size_t>(t * h * d + (t * h + 3) / 4 * 4) * sizeof(float);
}
// Backend::workspace_bytes(AttentionBackwardArgs) on CUDA: the dK/dV partials, 2 x [T, H, D] f32
// (none when H == G: nothing to split), plus the atomic part when that path runs.
std::size_t expected_workspace_bytes(std::int64_t t, std::int64_t h, std::int64_t g, std::int64_t d,
                                     bool atomic) {
  return static_cast<std::size_t>(h == g ? 0 : 2 * t * h * d) * sizeof(float) +
         (atomic ? atomic_dq_bytes(t, h, d) : 0);
}

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

// A case's bf16 inputs, its f64 reference forward + backward (want) and the naive bf16 one.
struct Expected {
  std::int64_t t = 0;
  HostTensor q, k, v, dout, cu;
  HostTensor out_w, lse_w, dq_w, dk_w, dv_w;  // reference backend (f64; lse f32)
  HostTensor out_n, dq_n, dk_n, dv_n;         // naive_attention
};
Expected expected_attention(const Case& c) {
  Expected x;
  for (auto l : c.lens) x.t += l;
  const std::int64_t t = x.t;
  const std::uint64_t seed = static_cast<std::uint64_t>(t * 31 + c.h * 7 + c.d);
  x.q = random_tensor({t, c.h, c.d}, kBf, seed, -2, 2);
  x.k = random_tensor({t, c.g, c.d}, kBf, seed + 1, -2, 2);
  x.v = random_tensor({t, c.g, c.d}, kBf, seed + 2);
  x.dout = random_tensor({t, c.h, c.d}, kBf, seed + 3);
  x.cu = cu_of(c.lens);
  const auto q64 = converted(x.q, kF64), k64 = converted(x.k, kF64), v64 = converted(x.v, kF64),
             do64 = converted(x.dout, kF64);
  x.out_w = HostTensor({t, c.h, c.d}, kF64);
  x.lse_w = HostTensor({c.h, t}, kF32);
  x.dq_w = HostTensor({t, c.h, c.d}, kF64);
  x.dk_w = HostTensor({t, c.g, c.d}, kF64);
  x.dv_w = HostTensor({t, c.g, c.d}, kF64);
  FERRY_CHECK_OK(reference_backend().attention({.out = x.out_w.view(),
                                                .lse = x.lse_w.view(),
                                                .q = q64.cview(),
                                                .k = k64.cview(),
                                                .v = v64.cview(),
                                                .cu_seqlens = x.cu.cview(),
                                                .causal = c.causal},
                                               mem::Stream::host()));
  FERRY_CHECK_OK(reference_backend().attention_backward({.d_q = x.dq_w.view(),
                                                         .d_k = x.dk_w.view(),
                                                         .d_v = x.dv_w.view(),
                                                         .d_out = do64.cview(),
                                                         .q = q64.cview(),
                                                         .k = k64.cview(),
                                                         .v = v64.cview(),
                                                         .out = x.out_w.cview(),
                                                         .lse = x.lse_w.cview(),
                                                         .cu_seqlens = x.cu.cview(),
                                                         .causal = c.causal},
                                                        mem::Stream::host()));
  x.out_n = HostTensor({t, c.h, c.d}, kF64);
  x.dq_n = HostTensor({t, c.h, c.d}, kF64);
  x.dk_n = HostTensor({t, c.g, c.d}, kF64);
  x.dv_n = HostTensor({t, c.g, c.d}, kF64);
  naive_attention(c, x.q, x.k, x.v, x.dout, x.out_n, x.dq_n, x.dk_n, x.dv_n);
  return x;
}

std::string case_name(const Case& c, std::int64_t t) {
  return "t=" + std::to_string(t) + " h=" + std::to_string(c.h) + " g=" + std::to_string(c.g) +
         " d=" + std::to_string(c.d) + " causal=" + std::to_string(c.causal);
}

// One case's inputs on the device, the default forward's out and lse, and bf16 gradient buffers,
// with the backward's arguments over them (no workspace).
struct DeviceAttention {
  DeviceTensor q, k, v, dout, cu, out, lse, gq, gk, gv;
  kernels::AttentionBackwardArgs args;
};

class KernelsAttention : public CudaTest {
 protected:
  DeviceAttention forward_on_device(const Case& c, const Expected& x) {
    const std::int64_t t = x.t;
    DeviceAttention a{.q = DeviceTensor(x.q),
                      .k = DeviceTensor(x.k),
                      .v = DeviceTensor(x.v),
                      .dout = DeviceTensor(x.dout),
                      .cu = DeviceTensor(x.cu),
                      .out = DeviceTensor({t, c.h, c.d}, kBf),
                      .lse = DeviceTensor({c.h, t}, kF32),
                      .gq = DeviceTensor({t, c.h, c.d}, kBf),
                      .gk = DeviceTensor({t, c.g, c.d}, kBf),
                      .gv = DeviceTensor({t, c.g, c.d}, kBf)};
    const Status st = cuda().attention({.out = a.out.view(),
                                        .lse = a.lse.view(),
                                        .q = a.q.cview(),
                                        .k = a.k.cview(),
                                        .v = a.v.cview(),
                                        .cu_seqlens = a.cu.cview(),
                                        .causal = c.causal},
                                       stream());
    EXPECT_TRUE(st.ok()) << st.to_string();
    a.args = {.d_q = a.gq.view(),
              .d_k = a.gk.view(),
              .d_v = a.gv.view(),
              .d_out = a.dout.cview(),
              .q = a.q.cview(),
              .k = a.k.cview(),
              .v = a.v.cview(),
              .out = a.out.cview(),
              .lse = a.lse.cview(),
              .cu_seqlens = a.cu.cview(),
              .causal = c.causal};
    return a;
  }
};

TEST_F(KernelsAttention, ForwardBackwardWithinTwiceNaiveBf16) {
  std::printf("attention by default: %s\n", kernels::cuda::attention_wgmma_available()
                                                ? "warpgroup-MMA kernels at D 64 / 128 (sm_90a)"
                                                : "mma.sync kernels (no sm_90a build or device)");
  const Case cases[] = {{{1}, 1, 1, 64, true},        {{17, 64, 130}, 4, 2, 64, true},
                        {{200}, 2, 1, 128, false},    {{5, 129, 77}, 4, 4, 128, true},
                        {{256}, 8, 2, 128, true},     {{300, 70}, 16, 2, 128, true},
                        {{97, 33}, 28, 4, 128, true}, {{150}, 16, 2, 64, false},
                        {{31, 160}, 28, 4, 64, true}, {{7, 23, 100}, 4, 2, 16, true},
                        {{65, 1}, 4, 1, 32, true},    {{90}, 2, 2, 32, false}};
  for (const Case& c : cases) {
    const Expected x = expected_attention(c);
    const std::int64_t t = x.t;
    DeviceTensor dq(x.q), dk(x.k), dv(x.v), ddo(x.dout), dcu(x.cu);
    std::optional<HostTensor> out_first;    // the first variant's forward output
    std::optional<HostTensor> eager_first;  // the first eager (FERRY_ATTN_FWD_LAZY=0) one
    for (const Variant& var : kVariants) {
      const ScopedVariant env(var);
      DeviceTensor dout_c(std::vector<std::int64_t>{t, c.h, c.d}, kBf),
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
      // Without a workspace every variant is deterministic (atomic dQ needs the workspace).
      FERRY_ASSERT_OK(cuda().attention_backward(ba, stream()));
      sync();
      const std::string what = case_name(c, t) + " variant: " + var.name;
      const auto out_got = dout_c.download();
      EXPECT_TRUE(within_twice_naive(out_got, x.out_w, x.out_n, 1e-3)) << "out " << what;
      // The default forward and the previous one (Q in registers) run the same MMAs in the same
      // order: the same bits.
      if (!out_first) {
        out_first = out_got;
      } else if (default_forward(var)) {
        // The default forward (only the backward differs): the same bits.
        EXPECT_TRUE(same_bits(*out_first, out_got)) << "forward differs from the default " << what;
      }
      // The eager forwards of 32 rows per warp, Q from shared memory or in registers, run the
      // same MMAs in the same order: the same bits (the lazy rescale rounds differently and is
      // held to the tolerance rule above like every variant).
      if (var.fwd_mt == nullptr && var.fwd_lazy != nullptr && std::string(var.fwd_lazy) == "0") {
        if (!eager_first) {
          eager_first = out_got;
        } else {
          EXPECT_TRUE(same_bits(*eager_first, out_got)) << "eager forwards differ " << what;
        }
      }
      EXPECT_LE(max_abs_diff(dlse.download(), x.lse_w), 1e-4 * (max_abs(x.lse_w) + 1.0))
          << "lse " << what;
      const auto gq1 = gq.download(), gk1 = gk.download(), gv1 = gv.download();
      EXPECT_TRUE(within_twice_naive(gq1, x.dq_w, x.dq_n, 1e-3)) << "dq " << what;
      EXPECT_TRUE(within_twice_naive(gk1, x.dk_w, x.dk_n, 1e-3)) << "dk " << what;
      EXPECT_TRUE(within_twice_naive(gv1, x.dv_w, x.dv_n, 1e-3)) << "dv " << what;
      // Determinism: the backward again gives the same bits.
      FERRY_ASSERT_OK(cuda().attention_backward(ba, stream()));
      sync();
      EXPECT_TRUE(same_bits(gq1, gq.download())) << what;
      EXPECT_TRUE(same_bits(gk1, gk.download())) << what;
      EXPECT_TRUE(same_bits(gv1, gv.download())) << what;

      // The workspace path (dK/dV per query-head slice, partials added in slice order): the full
      // workspace (one slice per query head) and a quarter of it (fewer, larger slices). Atomic
      // dQ: the full workspace, its accumulator plus a quarter of the partials, and 16 bytes less
      // than the accumulator (which runs the deterministic path).
      const bool atomic = atomic_dq(var, c.d);
      const std::size_t full = cuda().workspace_bytes(ba);
      ASSERT_EQ(full, expected_workspace_bytes(t, c.h, c.g, c.d, atomic));
      const std::size_t acc = atomic_dq_bytes(t, c.h, c.d);
      // (H == G on the deterministic path asks for none: nothing to run here.)
      const std::vector<std::size_t> sizes =
          atomic     ? std::vector<std::size_t>{full, acc + (full - acc) / 4, acc - 16}
          : full > 0 ? std::vector<std::size_t>{full, full / 4}
                     : std::vector<std::size_t>{};
      for (std::size_t bytes : sizes) {
        const bool runs_atomic = atomic && bytes >= acc;
        DeviceTensor ws(std::vector<std::int64_t>{static_cast<std::int64_t>(bytes)}, DType::kU8);
        kernels::AttentionBackwardArgs bw = ba;
        bw.workspace = ws.view();
        FERRY_ASSERT_OK(cuda().attention_backward(bw, stream()));
        sync();
        const std::string w = what + " workspace=" + std::to_string(bytes);
        const auto wq = gq.download(), wk = gk.download(), wv = gv.download();
        if (runs_atomic) {
          EXPECT_TRUE(within_twice_naive(wq, x.dq_w, x.dq_n, 1e-3)) << "dq (atomic) " << w;
        } else {
          EXPECT_TRUE(same_bits(gq1, wq)) << "dq does not use the workspace " << w;
        }
        EXPECT_TRUE(within_twice_naive(wk, x.dk_w, x.dk_n, 1e-3)) << "dk " << w;
        EXPECT_TRUE(within_twice_naive(wv, x.dv_w, x.dv_n, 1e-3)) << "dv " << w;
        FERRY_ASSERT_OK(cuda().attention_backward(bw, stream()));
        sync();
        // dK / dV are deterministic on every path; atomic dQ is held to the rule again.
        EXPECT_TRUE(same_bits(wk, gk.download())) << w;
        EXPECT_TRUE(same_bits(wv, gv.download())) << w;
        if (runs_atomic) {
          EXPECT_TRUE(within_twice_naive(gq.download(), x.dq_w, x.dq_n, 1e-3))
              << "dq (atomic, again) " << w;
        } else {
          EXPECT_TRUE(same_bits(wq, gq.download())) << w;
        }
      }
    }
  }
}

// The atomic-dQ backward against the deterministic one on the same inputs and the same (full)
// workspace: dK and dV bit for bit (the same kernel body, slices and MMA order; only dQ moved into
// it), and dQ within the tolerance rule twice over — against the naive bf16 loop and against the
// deterministic kernel's own error (err(atomic) <= 2 err(deterministic) + atol). Also run twice:
// dK / dV repeat bitwise, dQ may differ in the last bits (f32 adds in arrival order); the count
// of differing dQ elements is printed. Small shapes, so compute-sanitizer racecheck can run it
// (scripts/gpu_check.sh) over the dS^T staging and the cp.async pipeline.
TEST_F(KernelsAttention, AtomicDqMatchesDeterministicPath) {
  const Case cases[] = {{{300, 70}, 16, 2, 128, true}, {{5, 129, 77}, 4, 4, 128, true},
                        {{97, 33}, 28, 4, 128, true},  {{200}, 2, 1, 128, false},
                        {{150}, 8, 2, 64, false},      {{17, 64, 130}, 4, 2, 64, true},
                        {{31, 160}, 4, 1, 64, true}};
  for (const Case& c : cases) {
    const Expected x = expected_attention(c);
    const std::int64_t t = x.t;
    const std::string what = case_name(c, t);
    DeviceAttention dev = forward_on_device(c, x);
    kernels::AttentionBackwardArgs& ba = dev.args;
    DeviceTensor &gq = dev.gq, &gk = dev.gk, &gv = dev.gv;
    std::size_t bytes = 0;
    {
      const ScopedEnv env("FERRY_ATTN_BWD_DQ", "atomic");
      bytes = cuda().workspace_bytes(ba);
    }
    ASSERT_EQ(bytes, expected_workspace_bytes(t, c.h, c.g, c.d, true)) << what;
    DeviceTensor ws(std::vector<std::int64_t>{static_cast<std::int64_t>(bytes)}, DType::kU8);
    ba.workspace = ws.view();
    auto run = [&](const char* mode) {
      const ScopedEnv env("FERRY_ATTN_BWD_DQ", mode);
      const ScopedEnv wgmma("FERRY_ATTN_BWD_WGMMA", "0");  // (mma.sync, like the atomic one)
      FERRY_CHECK_OK(cuda().attention_backward(ba, stream()));
      sync();
      return std::array<HostTensor, 3>{gq.download(), gk.download(), gv.download()};
    };
    const auto det = run(nullptr);
    const auto at1 = run("atomic");
    const auto at2 = run("atomic");
    EXPECT_TRUE(same_bits(det[1], at1[1])) << "dk differs from the deterministic path " << what;
    EXPECT_TRUE(same_bits(det[2], at1[2])) << "dv differs from the deterministic path " << what;
    EXPECT_TRUE(within_twice_naive(det[0], x.dq_w, x.dq_n, 1e-3)) << "dq (deterministic) " << what;
    for (const auto* a : {&at1, &at2}) {
      EXPECT_TRUE(within_twice_naive((*a)[0], x.dq_w, x.dq_n, 1e-3)) << "dq (atomic) " << what;
      EXPECT_TRUE(within_twice_naive((*a)[0], x.dq_w, det[0], 1e-3))
          << "dq (atomic) vs the deterministic dq's error " << what;
    }
    EXPECT_TRUE(same_bits(at1[1], at2[1])) << "dk (atomic, twice) " << what;
    EXPECT_TRUE(same_bits(at1[2], at2[2])) << "dv (atomic, twice) " << what;
    std::int64_t differ = 0;
    for (std::int64_t i = 0; i < at1[0].numel(); ++i) differ += at1[0].get(i) != at2[0].get(i);
    std::printf("atomic dq %s: %lld of %lld elements differ between two runs, max |diff| %g\n",
                what.c_str(), static_cast<long long>(differ),
                static_cast<long long>(at1[0].numel()), max_abs_diff(at1[0], at2[0]));
  }
}

// The atomic-dQ kernel with fewer dK/dV slices than query heads per kv head (each CTA then runs
// several heads' items and adds its dK/dV partials), at workspaces of the accumulator plus a
// quarter or a half of the partials. Its dK / dV must be the deterministic mma.sync path's bits at
// the same partials region, twice. (Written when ForwardBackwardWithinTwiceNaiveBf16 failed at t =
// 150, 16 / 2 heads, D = 64, a quarter: wrong, unrepeatable dK. The cause was the tests' uploads,
// not the kernel: copy_to_device in gpu_test_util.h.)
TEST_F(KernelsAttention, AtomicDqWithSlicedWorkspace) {
  const Case cases[] = {{{150}, 16, 2, 64, false},  {{150}, 16, 2, 64, true},
                        {{128}, 16, 2, 64, false},  {{150}, 8, 2, 64, false},
                        {{150}, 16, 2, 128, false}, {{300, 70}, 16, 2, 128, true}};
  for (const Case& c : cases) {
    const Expected x = expected_attention(c);
    const std::int64_t t = x.t;
    DeviceAttention dev = forward_on_device(c, x);
    kernels::AttentionBackwardArgs& ba = dev.args;
    DeviceTensor &gq = dev.gq, &gk = dev.gk, &gv = dev.gv;
    const std::size_t acc = atomic_dq_bytes(t, c.h, c.d);
    const std::size_t partials = expected_workspace_bytes(t, c.h, c.g, c.d, false);
    for (const std::size_t bytes : {acc + partials / 4, acc + partials / 2}) {
      const std::string what = case_name(c, t) + " workspace=" + std::to_string(bytes);
      // The deterministic path gets the atomic one's partials region (the workspace less the
      // accumulator), so both choose the same slices.
      DeviceTensor ws(std::vector<std::int64_t>{static_cast<std::int64_t>(bytes)}, DType::kU8),
          ws_det(std::vector<std::int64_t>{static_cast<std::int64_t>(bytes - acc)}, DType::kU8);
      auto run = [&](const char* mode) {
        ba.workspace = mode != nullptr ? ws.view() : ws_det.view();
        const ScopedEnv env("FERRY_ATTN_BWD_DQ", mode);
        const ScopedEnv wgmma("FERRY_ATTN_BWD_WGMMA", "0");
        FERRY_CHECK_OK(cuda().attention_backward(ba, stream()));
        sync();
        return std::array<HostTensor, 3>{gq.download(), gk.download(), gv.download()};
      };
      const auto det = run(nullptr);
      const auto at1 = run("atomic");
      const auto at2 = run("atomic");
      const bool dk_same = same_bits(det[1], at1[1]), dv_same = same_bits(det[2], at1[2]);
      const bool dk_again = same_bits(at1[1], at2[1]);
      std::printf(
          "sliced atomic dq %s: dk %s the deterministic path's bits (max |diff| %g), "
          "%s on a second run; dv %s\n",
          what.c_str(), dk_same ? "has" : "does NOT have", max_abs_diff(det[1], at1[1]),
          dk_again ? "the same" : "DIFFERENT", dv_same ? "same bits" : "DIFFERS");
      EXPECT_TRUE(dk_same) << "dk " << what;
      EXPECT_TRUE(dv_same) << "dv " << what;
      EXPECT_TRUE(dk_again) << "dk twice " << what;
      EXPECT_TRUE(same_bits(at1[2], at2[2])) << "dv twice " << what;
      EXPECT_TRUE(within_twice_naive(det[1], x.dk_w, x.dk_n, 1e-3))
          << "dk (deterministic) " << what;
      for (const auto* a : {&at1, &at2})
        EXPECT_TRUE(within_twice_naive((*a)[0], x.dq_w, x.dq_n, 1e-3)) << "dq (atomic) " << what;
    }
  }
}

// Long sequences, checked on sampled rows (f64 per-row computations from the bf16 inputs; naive =
// the bf16 emulation of naive_attention on the same rows):
//   forward rows (token, head): out and lse, each row's own exact softmax;
//   dQ rows: the same plus dP, dS over the row's keys;
//   dK/dV rows (token, kv head): sums over every query of the group, with the GPU forward's lse
//   and rowsum(dO * out) (the backward's inputs; computing every lse exactly is O(S^2 D) per head).
// Every forward variant is checked on the forward rows; every backward variant (no workspace and
// the full workspace; with atomic dQ the latter runs the atomic kernel) on the gradient rows, from
// the default forward's out and lse. Also every variant's full dQ / dK / dV against the first one:
// |diff| <= 2 % of max |x| (a few bf16 ulps of the largest element; a dropped tile or a wrong
// fragment is far larger).
TEST_F(KernelsAttention, LongSequencesSampledRows) {
  const Case cases[] = {{{4096}, 16, 2, 128, true},
                        {{1000, 3096}, 28, 4, 128, true},
                        {{2048, 1, 1023}, 16, 2, 64, true},
                        {{1536}, 28, 4, 64, false},
                        {{700, 1348}, 16, 2, 128, false}};
  for (const Case& c : cases) {
    std::int64_t t = 0;
    for (auto l : c.lens) t += l;
    const std::int64_t h = c.h, g = c.g, d = c.d, grp = h / g;
    const std::uint64_t seed = static_cast<std::uint64_t>(t * 17 + h * 5 + d);
    const auto q = random_tensor({t, h, d}, kBf, seed, -2, 2),
               k = random_tensor({t, g, d}, kBf, seed + 1, -2, 2),
               v = random_tensor({t, g, d}, kBf, seed + 2),
               dout = random_tensor({t, h, d}, kBf, seed + 3);
    const auto cu = cu_of(c.lens);
    const auto qf = converted(q, kF32), kf = converted(k, kF32), vf = converted(v, kF32),
               df = converted(dout, kF32);
    const float* Q = static_cast<const float*>(qf.data());
    const float* K = static_cast<const float*>(kf.data());
    const float* V = static_cast<const float*>(vf.data());
    const float* DO = static_cast<const float*>(df.data());
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const float scale_f = 1.0f / std::sqrt(static_cast<float>(d));
    auto qrow = [&](std::int64_t tok, std::int64_t hh) { return Q + (tok * h + hh) * d; };
    auto dorow = [&](std::int64_t tok, std::int64_t hh) { return DO + (tok * h + hh) * d; };
    auto krow = [&](std::int64_t tok, std::int64_t kv) { return K + (tok * g + kv) * d; };
    auto vrow = [&](std::int64_t tok, std::int64_t kv) { return V + (tok * g + kv) * d; };
    auto dot64 = [&](const float* a, const float* b) {
      double acc = 0.0;
      for (std::int64_t x = 0; x < d; ++x) acc += static_cast<double>(a[x]) * b[x];
      return acc;
    };
    auto dot32 = [&](const float* a, const float* b) {
      float acc = 0.0f;
      for (std::int64_t x = 0; x < d; ++x) acc += a[x] * b[x];
      return acc;
    };

    // Sampled positions within a sequence of length len: both 32-row halves of a 64-row tile,
    // the +8 fragment rows, tile edges, the middle and the tail.
    auto sample = [](std::int64_t len) {
      std::vector<std::int64_t> out;
      for (std::int64_t p : {0L, 1L, 9L, 31L, 32L, 41L, 63L, 64L, 127L, 128L, len / 2 + 3, len - 65,
                             len - 33, len - 9, len - 1})
        if (p >= 0 && p < len && (out.empty() || std::find(out.begin(), out.end(), p) == out.end()))
          out.push_back(p);
      return out;
    };

    // Forward + dQ rows: f64 (want) and naive bf16 emulation, per (token, head).
    struct QRow {
      std::int64_t tok, hh;
      std::vector<double> out_w, dq_w;
      std::vector<float> out_n, dq_n;
      double lse_w;
    };
    std::vector<QRow> qrows;
    std::int64_t s0 = 0;
    for (std::int64_t len : c.lens) {
      for (std::int64_t i : sample(len)) {
        for (std::int64_t hh : {std::int64_t{0}, grp - 1, h - 1}) {
          QRow r{s0 + i,
                 hh,
                 std::vector<double>(d, 0.0),
                 std::vector<double>(d, 0.0),
                 std::vector<float>(d, 0.0f),
                 std::vector<float>(d, 0.0f),
                 0.0};
          const std::int64_t kv = hh / grp, jend = c.causal ? i + 1 : len;
          const float* qi = qrow(r.tok, hh);
          const float* doi = dorow(r.tok, hh);
          std::vector<double> sw(jend);
          std::vector<float> sn(jend);
          double mw = -INFINITY;
          float mn = -INFINITY;
          for (std::int64_t j = 0; j < jend; ++j) {
            sw[j] = dot64(qi, krow(s0 + j, kv)) * scale;
            sn[j] = rb(dot32(qi, krow(s0 + j, kv))) * scale_f;
            mw = std::max(mw, sw[j]);
            mn = std::max(mn, sn[j]);
          }
          double zw = 0.0;
          float zn = 0.0f;
          for (std::int64_t j = 0; j < jend; ++j) {
            zw += std::exp(sw[j] - mw);
            zn += std::exp(sn[j] - mn);
          }
          r.lse_w = mw + std::log(zw);
          std::vector<double> pw(jend), dpw(jend);
          std::vector<float> pn(jend), dpn(jend);
          for (std::int64_t j = 0; j < jend; ++j) {
            pw[j] = std::exp(sw[j] - r.lse_w);
            pn[j] = rb(std::exp(sn[j] - mn) / zn);
            const float* vj = vrow(s0 + j, kv);
            for (std::int64_t x = 0; x < d; ++x) {
              r.out_w[x] += pw[j] * vj[x];
              r.out_n[x] += pn[j] * vj[x];
            }
            dpw[j] = dot64(doi, vj);
            dpn[j] = rb(dot32(doi, vj));
          }
          double dsum_w = 0.0;
          float dsum_n = 0.0f;
          for (std::int64_t x = 0; x < d; ++x) {
            r.out_n[x] = rb(r.out_n[x]);
            dsum_w += static_cast<double>(doi[x]) * r.out_w[x];
          }
          for (std::int64_t j = 0; j < jend; ++j) dsum_n += pn[j] * dpn[j];
          for (std::int64_t j = 0; j < jend; ++j) {
            const double dsw = pw[j] * (dpw[j] - dsum_w);
            const float dsn = rb(pn[j] * (dpn[j] - dsum_n));
            const float* kj = krow(s0 + j, kv);
            for (std::int64_t x = 0; x < d; ++x) {
              r.dq_w[x] += dsw * kj[x];
              r.dq_n[x] += dsn * kj[x];
            }
          }
          for (std::int64_t x = 0; x < d; ++x) {
            r.dq_w[x] *= scale;
            r.dq_n[x] = rb(r.dq_n[x] * scale_f);
          }
          qrows.push_back(std::move(r));
        }
      }
      s0 += len;
    }
    // Gathers sampled rows of a downloaded [T, heads, D] tensor next to want / naive.
    auto check_rows = [&](const HostTensor& got, std::int64_t heads, auto&& rows, auto&& want_of,
                          auto&& naive_of, const std::string& what) {
      const std::int64_t n = static_cast<std::int64_t>(rows.size()) * d;
      HostTensor gt({n}, kF64), wt({n}, kF64), nt({n}, kF64);
      std::int64_t o = 0;
      for (const auto& r : rows)
        for (std::int64_t x = 0; x < d; ++x, ++o) {
          gt.set(o, got.get((r.tok * heads + r.hh) * d + x));
          wt.set(o, want_of(r)[x]);
          nt.set(o, naive_of(r)[x]);
        }
      EXPECT_TRUE(within_twice_naive(gt, wt, nt, 1e-3)) << what;
    };

    DeviceTensor dq(q), dk(k), dv(v), ddo(dout), dcu(cu);
    const std::string shape = "t=" + std::to_string(t) + " h=" + std::to_string(h) +
                              " g=" + std::to_string(g) + " d=" + std::to_string(d) +
                              " causal=" + std::to_string(c.causal) +
                              " seqs=" + std::to_string(c.lens.size());
    // Forward variants; the first (default) one's out / lse feed every backward below.
    DeviceTensor out0(std::vector<std::int64_t>{t, h, d}, kBf),
        lse0(std::vector<std::int64_t>{h, t}, kF32);
    for (const Variant& var : kVariants) {
      // A backward switch only: the default forward again.
      if (default_forward(var) && &var != &kVariants[0]) continue;
      const ScopedVariant env(var);
      const bool first = &var == &kVariants[0];
      DeviceTensor o(std::vector<std::int64_t>{t, h, d}, kBf),
          l(std::vector<std::int64_t>{h, t}, kF32);
      FERRY_ASSERT_OK(cuda().attention({.out = (first ? out0 : o).view(),
                                        .lse = (first ? lse0 : l).view(),
                                        .q = dq.cview(),
                                        .k = dk.cview(),
                                        .v = dv.cview(),
                                        .cu_seqlens = dcu.cview(),
                                        .causal = c.causal},
                                       stream()));
      sync();
      const auto got = (first ? out0 : o).download();
      const auto lse_got = (first ? lse0 : l).download();
      const std::string what = shape + " variant: " + var.name;
      check_rows(
          got, h, qrows, [](const QRow& r) -> const auto& { return r.out_w; },
          [](const QRow& r) -> const auto& { return r.out_n; }, "out " + what);
      double lse_err = 0.0;
      for (const QRow& r : qrows)
        lse_err = std::max(lse_err, std::abs(lse_got.get(r.hh * t + r.tok) - r.lse_w));
      EXPECT_LE(lse_err, 1e-4 * 16.0) << "lse " << what;
    }

    // dK / dV rows from the default forward's out and lse.
    const auto out_f = converted(out0.download(), kF32);
    const auto lse_h = lse0.download();
    const float* O = static_cast<const float*>(out_f.data());
    const float* LSE = static_cast<const float*>(lse_h.data());
    std::vector<double> dsum(static_cast<std::size_t>(t * h));
    for (std::int64_t tok = 0; tok < t; ++tok)
      for (std::int64_t hh = 0; hh < h; ++hh)
        dsum[tok * h + hh] = dot64(dorow(tok, hh), O + (tok * h + hh) * d);
    struct KRow {
      std::int64_t tok, hh;  // hh: the kv head
      std::vector<double> dk_w, dv_w;
      std::vector<float> dk_n, dv_n;
    };
    std::vector<KRow> krows;
    s0 = 0;
    for (std::int64_t len : c.lens) {
      for (std::int64_t j : sample(len)) {
        for (std::int64_t kv = 0; kv < g; ++kv) {
          KRow r{s0 + j,
                 kv,
                 std::vector<double>(d, 0.0),
                 std::vector<double>(d, 0.0),
                 std::vector<float>(d, 0.0f),
                 std::vector<float>(d, 0.0f)};
          const float* kj = krow(r.tok, kv);
          const float* vj = vrow(r.tok, kv);
          for (std::int64_t hh = kv * grp; hh < (kv + 1) * grp; ++hh) {
            std::vector<float> ak(d, 0.0f), av(d, 0.0f);
            for (std::int64_t i = c.causal ? j : 0; i < len; ++i) {
              const std::int64_t tok = s0 + i;
              const float* qi = qrow(tok, hh);
              const float* doi = dorow(tok, hh);
              const double lse = LSE[hh * t + tok], ds_row = dsum[tok * h + hh];
              const double pw = std::exp(dot64(qi, kj) * scale - lse);
              const double dsw = pw * (dot64(doi, vj) - ds_row);
              const float pn = rb(std::exp(rb(dot32(qi, kj)) * scale_f - static_cast<float>(lse)));
              const float dsn = rb(pn * (rb(dot32(doi, vj)) - static_cast<float>(ds_row)));
              for (std::int64_t x = 0; x < d; ++x) {
                r.dk_w[x] += dsw * qi[x] * scale;
                r.dv_w[x] += pw * doi[x];
                ak[x] += dsn * qi[x];
                av[x] += pn * doi[x];
              }
            }
            for (std::int64_t x = 0; x < d; ++x) {
              r.dk_n[x] += rb(ak[x] * scale_f);
              r.dv_n[x] += rb(av[x]);
            }
          }
          for (std::int64_t x = 0; x < d; ++x) {
            r.dk_n[x] = rb(r.dk_n[x]);
            r.dv_n[x] = rb(r.dv_n[x]);
          }
          krows.push_back(std::move(r));
        }
      }
      s0 += len;
    }

    std::optional<HostTensor> first_dq, first_dk, first_dv;
    auto close_to_first = [](const HostTensor& a, const HostTensor& b) {
      return max_abs_diff(a, b) <= 0.02 * max_abs(b) + 1e-6;
    };
    for (const Variant& var : kVariants) {
      const ScopedVariant env(var);
      const kernels::AttentionBackwardArgs ba{.d_q = {},
                                              .d_k = {},
                                              .d_v = {},
                                              .d_out = ddo.cview(),
                                              .q = dq.cview(),
                                              .k = dk.cview(),
                                              .v = dv.cview(),
                                              .out = out0.cview(),
                                              .lse = lse0.cview(),
                                              .cu_seqlens = dcu.cview(),
                                              .causal = c.causal};
      const std::size_t full = cuda().workspace_bytes(ba);
      for (std::size_t bytes : {std::size_t{0}, full}) {
        DeviceTensor gq(std::vector<std::int64_t>{t, h, d}, kBf),
            gk(std::vector<std::int64_t>{t, g, d}, kBf),
            gv(std::vector<std::int64_t>{t, g, d}, kBf),
            ws(std::vector<std::int64_t>{static_cast<std::int64_t>(
                   std::max<std::size_t>(bytes, 1))},
               DType::kU8);
        kernels::AttentionBackwardArgs bw = ba;
        bw.d_q = gq.view();
        bw.d_k = gk.view();
        bw.d_v = gv.view();
        if (bytes > 0) bw.workspace = ws.view();
        FERRY_ASSERT_OK(cuda().attention_backward(bw, stream()));
        sync();
        const std::string what =
            shape + " variant: " + var.name + " workspace=" + std::to_string(bytes);
        const auto hq = gq.download(), hk = gk.download(), hv = gv.download();
        check_rows(
            hq, h, qrows, [](const QRow& r) -> const auto& { return r.dq_w; },
            [](const QRow& r) -> const auto& { return r.dq_n; }, "dq " + what);
        check_rows(
            hk, g, krows, [](const KRow& r) -> const auto& { return r.dk_w; },
            [](const KRow& r) -> const auto& { return r.dk_n; }, "dk " + what);
        check_rows(
            hv, g, krows, [](const KRow& r) -> const auto& { return r.dv_w; },
            [](const KRow& r) -> const auto& { return r.dv_n; }, "dv " + what);
        if (!first_dq) {
          first_dq = hq;
          first_dk = hk;
          first_dv = hv;
        } else {
          EXPECT_TRUE(close_to_first(hq, *first_dq)) << "dq vs first " << what;
          EXPECT_TRUE(close_to_first(hk, *first_dk)) << "dk vs first " << what;
          EXPECT_TRUE(close_to_first(hv, *first_dv)) << "dv vs first " << what;
        }
      }
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
