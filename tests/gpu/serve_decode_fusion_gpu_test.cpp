// SPDX-License-Identifier: Apache-2.0
// The decode fusions (kernels/cuda/decode_fusion.h, docs/cuda.md "Decode fusions (session 12)")
// against the launches they replace, bit for bit on every output:
//   - small_m_gemm_multi (q/k/v, gate/up in one launch) vs one small-m launch per output: the
//     backend's f32 GEMM (its small-m kernel) and small_m_gemm_bf16w, m = 1..4, Qwen3-30B-A3B's
//     q [4096 x 2048], k, v [512 x 2048], gate/up, the router alone, and odd shapes (scalar loop,
//     row padding, an empty output, one weight misaligned so the outputs would take different
//     loops), without bias, with bias on some outputs, with bias + alpha + beta;
//   - add_rms_norm vs the backend's add then rms_norm, f32, every kernel launch_rms_norm picks
//     (warp per row in registers for C = 256..2048, CTA per row up to 32768, two passes beyond and
//     for C < 256, scalar for C % 4 != 0, the two-launch fallback for a misaligned y), in place
//     and not, with and without rstd, 1..4 and 7 rows;
//   - qk_norm_rope vs the backend's two rms_norms and two ropes: Qwen3-30B-A3B's 32 / 4 heads of
//     128, fixture-sized heads, partial rotary dims, 63 vectors per row, positions up to 1e5,
//     attention scaling != 1, 1..4 tokens; d = 256 and d % 4 != 0 are declined (nothing runs).
//   - qk_norm_rope_kv_write vs qk_norm_rope then kv_write: q, k, rstd and the whole (poisoned)
//     paged cache, on random block tables, a decode step and a prefill chunk + decodes, G < H,
//     D 64 and 128, block sizes 1..16; d = 256 declined (the cache untouched);
//   - the whole engine (Fixtures/ServeDecodeFusionEngine.*, the six HF fixtures: per-head q/k
//     norms, biases, full-width norms, dense MLPs and MoE): an engine created with the fusions on
//     (all, and all but the KV write in the q/k norm + rope launch) gives the token ids and logits
//     bits of one created with them off, resident with f32 and bf16 dense weights and paged (cap
//     top-k + 1), 3 concurrent requests, chunked prefill, decode graphs.
// The serving engine's own tests (*ServeModesCuda*, *DenseBf16*, *DeviceResolve*) run the runner
// with the fusions on (the default), so they hold the fused runner to the same contracts.
// Skips, saying so, without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kernels/cuda/decode_fusion.h"
#include "kernels/cuda/serve_kernels.h"
#include "tests/gpu/gpu_test_util.h"
#include "unit/serve/serve_test_util.h"

namespace ferry::serve {
namespace {

using ferry::testing::CudaTest;
using ferry::testing::DeviceBuf;
using ferry::testing::down;
using ferry::testing::same_bits;
using ferry::testing::up;
using kernels::cuda::SmallMGemmMultiArgs;

TensorView rows(void* p, DType dt, std::int64_t r, std::int64_t c, std::int64_t ld) {
  TensorView v = TensorView::contiguous(p, dt, Device::kCuda, {r, c});
  v.stride[0] = ld;
  return v;
}

std::vector<float> normal(std::mt19937& rng, std::size_t n, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

class ServeDecodeFusion : public CudaTest {};

// ---- q/k/v (gate/up) small-m GEMMs in one launch ----

struct MultiShape {
  std::int64_t k;
  std::vector<std::int64_t> n;  // one per output (1..3)
  std::int64_t pad;             // extra elements per row of a, the weights and the outputs
  int shift;                    // output 1's weight starts this many elements into its buffer
};

TEST_F(ServeDecodeFusion, SmallMMultiEqualsOneLaunchPerOutput) {
  if (!kernels::cuda::small_m_gemm_enabled()) {
    GTEST_SKIP() << "FERRY_SMALL_M_GEMM=0: the f32 GEMM is not the small-m kernel";
  }
  const std::vector<MultiShape> shapes = {
      {2048, {4096, 512, 512}, 0, 0},  // Qwen3-30B-A3B q / k / v
      {2048, {768, 768}, 0, 0},        // a dense MLP's gate / up
      {2048, {128}, 0, 0},             // the router alone
      {13, {7, 5, 3}, 1, 0},           // scalar loop (k % 4 != 0), padded rows
      {100, {33, 1, 17}, 0, 0},        // vector loop, odd n
      {64, {9, 16, 8}, 4, 1},          // output 1 misaligned: one launch per output
      {64, {0, 8, 3}, 0, 0},           // an empty output
      {4099, {5, 3, 2}, 0, 0},         // long scalar rows
  };
  std::mt19937 rng(1201);
  int cases = 0;
  for (const MultiShape& sh : shapes) {
    const int count = static_cast<int>(sh.n.size());
    const std::int64_t k = sh.k, lda = k + sh.pad, ldb = k + sh.pad;
    for (const bool bf16 : {false, true}) {
      for (std::int64_t m = 1; m <= 4; ++m) {
        for (int variant = 0; variant < 3; ++variant) {
          // 0: no bias; 1: bias on outputs 0 and 2; 2: bias everywhere, alpha 0.5, beta 0.75.
          const float alpha = variant == 2 ? 0.5f : 1.0f, beta = variant == 2 ? 0.75f : 0.0f;
          const std::string what =
              fmt::format("{} k {} n[0] {} count {} pad {} shift {} m {} v {}",
                          bf16 ? "bf16" : "f32", k, sh.n[0], count, sh.pad, sh.shift, m, variant);
          DeviceBuf d_a(std::size_t(m * lda) * 4);
          up(d_a.p, normal(rng, std::size_t(m * lda)));
          std::vector<std::unique_ptr<DeviceBuf>> w, bias, ref, fused;
          std::vector<std::vector<float>> o0(static_cast<std::size_t>(count));
          SmallMGemmMultiArgs args{.count = count,
                                   .a = d_a.as<float>(),
                                   .m = m,
                                   .k = k,
                                   .lda = lda,
                                   .alpha = alpha,
                                   .beta = beta,
                                   .bf16 = bf16};
          for (int o = 0; o < count; ++o) {
            const std::int64_t n = sh.n[std::size_t(o)], ldo = n + sh.pad;
            const int shift = o == 1 ? sh.shift : 0;
            const std::size_t welems = std::size_t(n * ldb + shift);
            std::vector<float> wf = normal(rng, welems, 0.1f);
            w.push_back(std::make_unique<DeviceBuf>(welems * 4));
            if (bf16) {
              std::vector<std::uint16_t> wb(welems);
              for (std::size_t i = 0; i < welems; ++i) wb[i] = f32_to_bf16(wf[i]);
              up(w.back()->p, wb);
            } else {
              up(w.back()->p, wf);
            }
            bias.push_back(std::make_unique<DeviceBuf>(std::size_t(n) * 4));
            up(bias.back()->p, normal(rng, std::size_t(n)));
            o0[std::size_t(o)] = normal(rng, std::size_t(m * ldo));
            ref.push_back(std::make_unique<DeviceBuf>(std::size_t(m * ldo) * 4));
            fused.push_back(std::make_unique<DeviceBuf>(std::size_t(m * ldo) * 4));
            up(ref.back()->p, o0[std::size_t(o)]);
            up(fused.back()->p, o0[std::size_t(o)]);
            const bool with_bias = variant == 2 || (variant == 1 && o != 1);
            const float* d_bias = with_bias ? bias.back()->as<float>() : nullptr;
            const void* d_w = static_cast<const char*>(w.back()->p) + shift * (bf16 ? 2 : 4);
            args.outs[o] = {.out = fused.back()->as<float>(),
                            .b = d_w,
                            .bias = d_bias,
                            .n = n,
                            .ldb = ldb,
                            .ldo = ldo};
            if (n == 0) continue;
            // The reference: this output's own small-m launch.
            Status r;
            if (bf16) {
              r = kernels::cuda::small_m_gemm_bf16w({.out = ref.back()->as<float>(),
                                                     .a = d_a.as<float>(),
                                                     .b = static_cast<const std::uint16_t*>(d_w),
                                                     .bias = d_bias,
                                                     .m = m,
                                                     .n = n,
                                                     .k = k,
                                                     .lda = lda,
                                                     .ldb = ldb,
                                                     .ldo = ldo,
                                                     .alpha = alpha,
                                                     .beta = beta},
                                                    stream());
            } else {
              r = cuda().gemm({.out = rows(ref.back()->p, DType::kF32, m, n, ldo),
                               .a = rows(d_a.p, DType::kF32, m, k, lda),
                               .b = rows(const_cast<void*>(d_w), DType::kF32, n, k, ldb),
                               .bias = with_bias ? ConstTensorView::contiguous(d_bias, DType::kF32,
                                                                               Device::kCuda, {n})
                                                 : ConstTensorView{},
                               .trans_b = true,
                               .alpha = alpha,
                               .beta = beta},
                              stream());
            }
            ASSERT_TRUE(r.ok()) << what << ": " << r.to_string();
          }
          const Status f = kernels::cuda::small_m_gemm_multi(args, stream());
          ASSERT_TRUE(f.ok()) << what << ": " << f.to_string();
          sync();
          for (int o = 0; o < count; ++o) {
            const std::size_t elems = o0[std::size_t(o)].size();
            const std::vector<float> want = down<float>(ref[std::size_t(o)]->p, elems);
            const std::vector<float> got = down<float>(fused[std::size_t(o)]->p, elems);
            EXPECT_TRUE(same_bits(want, got)) << what << ": output " << o;
            if (sh.n[std::size_t(o)] == 0) {
              EXPECT_TRUE(same_bits(got, o0[std::size_t(o)])) << what;
            }
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, int(shapes.size()) * 2 * 4 * 3);
  // Outside 1..3 outputs or 1..4 rows: refused, not launched.
  DeviceBuf d(64);
  SmallMGemmMultiArgs bad{.count = 1, .a = d.as<float>(), .m = 5, .k = 1, .lda = 1};
  bad.outs[0] = {.out = d.as<float>(), .b = d.p, .n = 1, .ldb = 1, .ldo = 1};
  EXPECT_FALSE(kernels::cuda::small_m_gemm_multi(bad, stream()).ok());
  bad.m = 1;
  bad.count = 4;
  EXPECT_FALSE(kernels::cuda::small_m_gemm_multi(bad, stream()).ok());
}

// ---- residual add + rms_norm ----

TEST_F(ServeDecodeFusion, AddRmsNormEqualsAddThenNorm) {
  // C: warp-in-registers (256, 1024, 2048), CTA per row (4096, 8192, 32768), two passes (64,
  // 33000, 4), scalar (13, 6).
  const std::vector<std::int64_t> widths = {2048,  64,    256, 1024, 4096, 8192,
                                            32768, 33000, 13,  6,    4};
  std::mt19937 rng(1202);
  int cases = 0;
  for (const std::int64_t c : widths) {
    for (const std::int64_t n : {1, 2, 3, 4, 7}) {
      for (int mode = 0; mode < 4; ++mode) {
        // bit 0: in place (x_out == x); bit 1: y one float off 16-byte alignment, no rstd.
        const bool in_place = (mode & 1) != 0, shifted = (mode & 2) != 0;
        const std::string what =
            fmt::format("c {} n {} in_place {} shifted {}", c, n, in_place, shifted);
        const std::size_t elems = std::size_t(n * c);
        const std::vector<float> x = normal(rng, elems), y = normal(rng, elems),
                                 w = normal(rng, std::size_t(c));
        const float eps = 1e-6f;
        DeviceBuf d_x(elems * 4), d_y(elems * 4 + 16), d_w(std::size_t(c) * 4);
        DeviceBuf d_xref(elems * 4), d_href(elems * 4), d_rref(std::size_t(n) * 4);
        DeviceBuf d_xout(elems * 4), d_h(elems * 4), d_r(std::size_t(n) * 4);
        float* y_ptr = d_y.as<float>() + (shifted ? 1 : 0);
        ASSERT_EQ(ferry::testing::copy_to_device(y_ptr, y.data(), elems * 4), cudaSuccess);
        up(d_x.p, x);
        up(d_xref.p, x);
        up(d_w.p, w);
        // The reference: the backend's add (in place, as the runner) then its rms_norm.
        const TensorView xref =
            TensorView::contiguous(d_xref.p, DType::kF32, Device::kCuda, {n, c});
        const Status a = cuda().add(
            {.out = xref,
             .a = xref,
             .b = ConstTensorView::contiguous(y_ptr, DType::kF32, Device::kCuda, {n, c})},
            stream());
        ASSERT_TRUE(a.ok()) << what << ": " << a.to_string();
        const Status r = cuda().rms_norm(
            {.out = TensorView::contiguous(d_href.p, DType::kF32, Device::kCuda, {n, c}),
             .rstd = TensorView::contiguous(d_rref.p, DType::kF32, Device::kCuda, {n}),
             .in = xref,
             .weight = ConstTensorView::contiguous(d_w.p, DType::kF32, Device::kCuda, {c}),
             .eps = eps},
            stream());
        ASSERT_TRUE(r.ok()) << what << ": " << r.to_string();
        float* x_out = in_place ? d_x.as<float>() : d_xout.as<float>();
        const Status f = kernels::cuda::add_rms_norm({.x_out = x_out,
                                                      .out = d_h.as<float>(),
                                                      .rstd = shifted ? nullptr : d_r.as<float>(),
                                                      .x = d_x.as<float>(),
                                                      .y = y_ptr,
                                                      .weight = d_w.as<float>(),
                                                      .n = n,
                                                      .c = c,
                                                      .eps = eps},
                                                     stream());
        ASSERT_TRUE(f.ok()) << what << ": " << f.to_string();
        sync();
        EXPECT_TRUE(same_bits(down<float>(d_xref.p, elems), down<float>(x_out, elems)))
            << what << ": residual";
        EXPECT_TRUE(same_bits(down<float>(d_href.p, elems), down<float>(d_h.p, elems)))
            << what << ": normed rows";
        if (!shifted) {
          EXPECT_TRUE(
              same_bits(down<float>(d_rref.p, std::size_t(n)), down<float>(d_r.p, std::size_t(n))))
              << what << ": rstd";
        }
        if (!in_place) {
          EXPECT_TRUE(same_bits(down<float>(d_x.p, elems), x)) << what << ": x kept";
        }
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, int(widths.size()) * 5 * 4);
}

// ---- Qwen3's q/k norms + rope ----

struct QkShape {
  std::int64_t h, g, d, r;
  bool fused;  // the fused kernel takes it (else qk_norm_rope declines)
};

TEST_F(ServeDecodeFusion, QkNormRopeEqualsNormsThenRopes) {
  const std::vector<QkShape> shapes = {
      {32, 4, 128, 128, true},  // Qwen3-30B-A3B
      {4, 2, 16, 16, true},     // fixture-sized heads
      {8, 8, 64, 32, true},     // partial rotary dims
      {3, 1, 252, 252, true},   // 63 vectors per row, two per lane
      {2, 1, 4, 4, true},       // one vector per row
      {2, 2, 256, 256, false},  // the warp-in-registers rms_norm: declined
      {2, 1, 18, 18, false},    // no 16-byte rows: declined
  };
  const std::vector<std::int32_t> all_pos = {100000, 0, 17, 4095};
  std::mt19937 rng(1203);
  int cases = 0;
  for (const QkShape& sh : shapes) {
    for (std::int64_t t = 1; t <= 4; ++t) {
      for (const float scaling : {1.0f, 0.8f}) {
        const std::string what =
            fmt::format("h {} g {} d {} r {} t {} scaling {}", sh.h, sh.g, sh.d, sh.r, t, scaling);
        const std::size_t qn = std::size_t(t * sh.h * sh.d), kn = std::size_t(t * sh.g * sh.d);
        const std::vector<float> q = normal(rng, qn, 3.0f), k = normal(rng, kn, 3.0f),
                                 qw = normal(rng, std::size_t(sh.d)),
                                 kw = normal(rng, std::size_t(sh.d));
        std::vector<float> inv_freq(std::size_t(sh.r / 2));
        for (std::size_t i = 0; i < inv_freq.size(); ++i) {
          inv_freq[i] = static_cast<float>(1.0 / std::pow(1e6, 2.0 * double(i) / double(sh.r)));
        }
        const std::vector<std::int32_t> pos(all_pos.begin(), all_pos.begin() + t);
        const float eps = 1e-6f;
        DeviceBuf d_q(qn * 4), d_k(kn * 4), d_qw(std::size_t(sh.d) * 4),
            d_kw(std::size_t(sh.d) * 4);
        DeviceBuf d_inv(inv_freq.size() * 4), d_pos(pos.size() * 4);
        DeviceBuf d_qref(qn * 4), d_kref(kn * 4), d_qrref(std::size_t(t * sh.h) * 4),
            d_krref(std::size_t(t * sh.g) * 4);
        DeviceBuf d_qout(qn * 4), d_kout(kn * 4), d_qr(std::size_t(t * sh.h) * 4),
            d_kr(std::size_t(t * sh.g) * 4);
        up(d_q.p, q);
        up(d_k.p, k);
        up(d_qw.p, qw);
        up(d_kw.p, kw);
        up(d_inv.p, inv_freq);
        up(d_pos.p, pos);
        const Result<bool> ran = kernels::cuda::qk_norm_rope({.q_out = d_qout.as<float>(),
                                                              .q_rstd = d_qr.as<float>(),
                                                              .q_in = d_q.as<float>(),
                                                              .q_weight = d_qw.as<float>(),
                                                              .k_out = d_kout.as<float>(),
                                                              .k_rstd = d_kr.as<float>(),
                                                              .k_in = d_k.as<float>(),
                                                              .k_weight = d_kw.as<float>(),
                                                              .positions = d_pos.as<std::int32_t>(),
                                                              .inv_freq = d_inv.as<float>(),
                                                              .t = t,
                                                              .h = sh.h,
                                                              .g = sh.g,
                                                              .d = sh.d,
                                                              .r = sh.r,
                                                              .eps = eps,
                                                              .scaling = scaling},
                                                             stream());
        ASSERT_TRUE(ran.ok()) << what << ": " << ran.status().to_string();
        ASSERT_EQ(*ran, sh.fused) << what;
        if (!sh.fused) {
          ++cases;
          continue;
        }
        // The reference: the backend's two rms_norms over head rows, then its two ropes.
        const auto norm = [&](void* out, void* rstd, void* in, void* weight, std::int64_t heads) {
          return cuda().rms_norm(
              {.out = TensorView::contiguous(out, DType::kF32, Device::kCuda, {t * heads, sh.d}),
               .rstd = TensorView::contiguous(rstd, DType::kF32, Device::kCuda, {t * heads}),
               .in = ConstTensorView::contiguous(in, DType::kF32, Device::kCuda, {t * heads, sh.d}),
               .weight = ConstTensorView::contiguous(weight, DType::kF32, Device::kCuda, {sh.d}),
               .eps = eps},
              stream());
        };
        const auto rope = [&](void* x, std::int64_t heads) {
          return cuda().rope(
              {.x = TensorView::contiguous(x, DType::kF32, Device::kCuda, {t, heads, sh.d}),
               .positions = ConstTensorView::contiguous(d_pos.p, DType::kI32, Device::kCuda, {t}),
               .inv_freq =
                   ConstTensorView::contiguous(d_inv.p, DType::kF32, Device::kCuda, {sh.r / 2}),
               .attention_scaling = scaling},
              stream());
        };
        for (const Status& s : {norm(d_qref.p, d_qrref.p, d_q.p, d_qw.p, sh.h),
                                norm(d_kref.p, d_krref.p, d_k.p, d_kw.p, sh.g),
                                rope(d_qref.p, sh.h), rope(d_kref.p, sh.g)}) {
          ASSERT_TRUE(s.ok()) << what << ": " << s.to_string();
        }
        sync();
        EXPECT_TRUE(same_bits(down<float>(d_qref.p, qn), down<float>(d_qout.p, qn)))
            << what << ": q";
        EXPECT_TRUE(same_bits(down<float>(d_kref.p, kn), down<float>(d_kout.p, kn)))
            << what << ": k";
        EXPECT_TRUE(same_bits(down<float>(d_qrref.p, std::size_t(t * sh.h)),
                              down<float>(d_qr.p, std::size_t(t * sh.h))))
            << what << ": q rstd";
        EXPECT_TRUE(same_bits(down<float>(d_krref.p, std::size_t(t * sh.g)),
                              down<float>(d_kr.p, std::size_t(t * sh.g))))
            << what << ": k rstd";
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, int(shapes.size()) * 4 * 2);
}

// ---- q/k norm + rope with the paged KV cache write in the same launch ----

struct QkKvShape {
  std::int64_t h, g, d, r;
  int block_tokens;
  bool fused;  // qk_norm_rope_kv_write takes it (else it declines like qk_norm_rope)
};

// (a) qk_norm_rope then kv_write vs (b) qk_norm_rope_kv_write: q, k, both rstd and the whole
// cache buffer (both poisoned alike first) bit for bit, on a random block-table layout of three
// sequences: a decode step (T = 1 per sequence) and a mixed step (a prefill chunk of 5 + decodes).
TEST_F(ServeDecodeFusion, QkNormRopeKvWriteEqualsQkNormRopeThenKvWrite) {
  const std::vector<QkKvShape> shapes = {
      {32, 4, 128, 128, 16, true},  // Qwen3-30B-A3B
      {8, 2, 64, 64, 4, true},      // D 64
      {6, 2, 128, 64, 3, true},     // partial rotary dims, odd block size
      {4, 1, 64, 64, 1, true},      // one token per block
      {2, 1, 256, 256, 4, false},   // declined (qk_norm_rope's domain): nothing runs
  };
  constexpr int kSeqs = 3, kLayers = 2, kLayer = 1, kBlocksPerSeq = 6;
  std::mt19937 rng(1205);
  int cases = 0;
  for (const QkKvShape& sh : shapes) {
    const std::int64_t GD = sh.g * sh.d;
    // A random layout: the pool's blocks shuffled, each sequence's table a run of them, padded.
    const int capacity = kSeqs * kBlocksPerSeq + 5;
    std::vector<std::int32_t> perm(static_cast<std::size_t>(capacity));
    for (int i = 0; i < capacity; ++i) perm[std::size_t(i)] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    const int stride = kBlocksPerSeq + 1;
    std::vector<std::int32_t> tables(std::size_t(kSeqs * stride), -1);
    for (int q = 0; q < kSeqs; ++q) {
      for (int b = 0; b < kBlocksPerSeq; ++b) {
        tables[std::size_t(q * stride + b)] = perm[std::size_t(q * kBlocksPerSeq + b)];
      }
    }
    const int max_pos = kBlocksPerSeq * sh.block_tokens - 1;
    std::uniform_int_distribution<int> pos_d(0, max_pos - 5);
    struct Step {
      std::vector<std::int32_t> seq_of, pos;
      const char* name;
    };
    std::vector<Step> steps;
    {
      Step dec{{}, {}, "decodes"};
      for (int q = 0; q < kSeqs; ++q) {
        dec.seq_of.push_back(q);
        dec.pos.push_back(pos_d(rng));
      }
      steps.push_back(dec);
      Step mixed{{0}, {pos_d(rng)}, "prefill chunk + decodes"};
      const int start = pos_d(rng);
      for (int i = 0; i < 5; ++i) {
        mixed.seq_of.push_back(1);
        mixed.pos.push_back(start + i);
      }
      mixed.seq_of.push_back(2);
      mixed.pos.push_back(max_pos);  // the last position of the last block
      steps.push_back(mixed);
    }
    for (const Step& st : steps) {
      const std::int64_t t = static_cast<std::int64_t>(st.pos.size());
      const std::string what = fmt::format("h {} g {} d {} r {} block_tokens {}, {} (t {})", sh.h,
                                           sh.g, sh.d, sh.r, sh.block_tokens, st.name, t);
      const std::size_t qn = std::size_t(t * sh.h * sh.d), kn = std::size_t(t * GD);
      const std::vector<float> q = normal(rng, qn, 3.0f), k = normal(rng, kn, 3.0f),
                               v = normal(rng, kn), qw = normal(rng, std::size_t(sh.d)),
                               kw = normal(rng, std::size_t(sh.d));
      std::vector<float> inv_freq(std::size_t(sh.r / 2));
      for (std::size_t i = 0; i < inv_freq.size(); ++i) {
        inv_freq[i] = static_cast<float>(1.0 / std::pow(1e6, 2.0 * double(i) / double(sh.r)));
      }
      const float eps = 1e-6f, scaling = 0.8f;
      const std::int64_t layer_stride = std::int64_t(capacity) * 2 * sh.block_tokens * GD;
      const std::size_t pool_bytes = std::size_t(kLayers * layer_stride) * 4;
      DeviceBuf d_q(qn * 4), d_k(kn * 4), d_v(kn * 4), d_qw(std::size_t(sh.d) * 4),
          d_kw(std::size_t(sh.d) * 4), d_inv(inv_freq.size() * 4);
      DeviceBuf d_pos(std::size_t(t) * 4), d_seq(std::size_t(t) * 4), d_tab(tables.size() * 4);
      up(d_q.p, q);
      up(d_k.p, k);
      up(d_v.p, v);
      up(d_qw.p, qw);
      up(d_kw.p, kw);
      up(d_inv.p, inv_freq);
      up(d_pos.p, st.pos);
      up(d_seq.p, st.seq_of);
      up(d_tab.p, tables);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      // [0]: (a) the two launches; [1]: (b) the fused launch. Every output poisoned alike.
      std::vector<std::unique_ptr<DeviceBuf>> qo, ko, qr, kr, pool;
      for (int i = 0; i < 2; ++i) {
        qo.push_back(std::make_unique<DeviceBuf>(qn * 4));
        ko.push_back(std::make_unique<DeviceBuf>(kn * 4));
        qr.push_back(std::make_unique<DeviceBuf>(std::size_t(t * sh.h) * 4));
        kr.push_back(std::make_unique<DeviceBuf>(std::size_t(t * sh.g) * 4));
        pool.push_back(std::make_unique<DeviceBuf>(pool_bytes));
        for (const auto& [p, n] :
             {std::pair{qo[i]->p, qn * 4}, std::pair{ko[i]->p, kn * 4},
              std::pair{qr[i]->p, std::size_t(t * sh.h) * 4},
              std::pair{kr[i]->p, std::size_t(t * sh.g) * 4}, std::pair{pool[i]->p, pool_bytes}}) {
          ASSERT_EQ(cudaMemsetAsync(p, 0xff, n, raw_stream()), cudaSuccess) << what;
        }
      }
      const auto qk_args = [&](int i) {
        return kernels::cuda::QkNormRopeArgs{.q_out = qo[i]->as<float>(),
                                             .q_rstd = qr[i]->as<float>(),
                                             .q_in = d_q.as<float>(),
                                             .q_weight = d_qw.as<float>(),
                                             .k_out = ko[i]->as<float>(),
                                             .k_rstd = kr[i]->as<float>(),
                                             .k_in = d_k.as<float>(),
                                             .k_weight = d_kw.as<float>(),
                                             .positions = d_pos.as<std::int32_t>(),
                                             .inv_freq = d_inv.as<float>(),
                                             .t = t,
                                             .h = sh.h,
                                             .g = sh.g,
                                             .d = sh.d,
                                             .r = sh.r,
                                             .eps = eps,
                                             .scaling = scaling};
      };
      const auto layout = [&](int i) {
        return kernels::cuda::PagedKvLayout{.base = pool[i]->as<float>(),
                                            .layer_stride = layer_stride,
                                            .block_tokens = sh.block_tokens,
                                            .G = int(sh.g),
                                            .D = int(sh.d)};
      };
      const kernels::cuda::PagedStep step{.seq_of = d_seq.as<std::int32_t>(),
                                          .pos = d_pos.as<std::int32_t>(),
                                          .tables = d_tab.as<std::int32_t>(),
                                          .table_stride = stride,
                                          .T = t};
      const std::uint64_t kv_calls =
          kernels::cuda::decode_fusion_calls(kernels::cuda::DecodeFusion::kQkNormRopeKv);
      const Result<bool> fused = kernels::cuda::qk_norm_rope_kv_write(
          {.qk = qk_args(1), .kv = layout(1), .layer = kLayer, .step = step, .v = d_v.as<float>()},
          stream());
      ASSERT_TRUE(fused.ok()) << what << ": " << fused.status().to_string();
      ASSERT_EQ(*fused, sh.fused) << what;
      EXPECT_EQ(kernels::cuda::decode_fusion_calls(kernels::cuda::DecodeFusion::kQkNormRopeKv),
                kv_calls + (sh.fused ? 1 : 0))
          << what;
      const std::size_t pool_floats = pool_bytes / 4;
      if (!sh.fused) {  // declined: nothing enqueued, the cache keeps its poison
        sync();
        const std::vector<float> p1 = down<float>(pool[1]->p, pool_floats);
        std::vector<std::uint32_t> bits(pool_floats);
        std::memcpy(bits.data(), p1.data(), pool_bytes);
        EXPECT_TRUE(std::all_of(bits.begin(), bits.end(), [](std::uint32_t b) {
          return b == 0xffffffffu;
        })) << what;
        ++cases;
        continue;
      }
      // (a): the fused q/k norm + rope, then kv_write of its k rows and v.
      const Result<bool> ran = kernels::cuda::qk_norm_rope(qk_args(0), stream());
      ASSERT_TRUE(ran.ok()) << what << ": " << ran.status().to_string();
      ASSERT_TRUE(*ran) << what;
      const Status w = kernels::cuda::kv_write(layout(0), kLayer, step, ko[0]->as<float>(),
                                               d_v.as<float>(), stream());
      ASSERT_TRUE(w.ok()) << what << ": " << w.to_string();
      sync();
      EXPECT_TRUE(same_bits(down<float>(qo[0]->p, qn), down<float>(qo[1]->p, qn))) << what << ": q";
      EXPECT_TRUE(same_bits(down<float>(ko[0]->p, kn), down<float>(ko[1]->p, kn))) << what << ": k";
      EXPECT_TRUE(same_bits(down<float>(qr[0]->p, std::size_t(t * sh.h)),
                            down<float>(qr[1]->p, std::size_t(t * sh.h))))
          << what << ": q rstd";
      EXPECT_TRUE(same_bits(down<float>(kr[0]->p, std::size_t(t * sh.g)),
                            down<float>(kr[1]->p, std::size_t(t * sh.g))))
          << what << ": k rstd";
      const std::vector<float> p0 = down<float>(pool[0]->p, pool_floats),
                               p1 = down<float>(pool[1]->p, pool_floats);
      EXPECT_EQ(std::memcmp(p0.data(), p1.data(), pool_bytes), 0) << what << ": the cache";
      // kv_write wrote exactly the step's K and V rows (2 * t * G*D floats) over the poison.
      std::vector<std::uint32_t> bits(pool_floats);
      std::memcpy(bits.data(), p0.data(), pool_bytes);
      EXPECT_EQ(
          std::count_if(bits.begin(), bits.end(), [](std::uint32_t b) { return b != 0xffffffffu; }),
          std::ptrdiff_t(2 * kn))
          << what;
      ++cases;
    }
  }
  EXPECT_EQ(cases, int(shapes.size()) * 2);
}

// ---- the whole engine: fusions on vs off in one process ----

EngineConfig engine_config(ExpertMode mode, int cap, DType dense) {
  EngineConfig cfg;
  cfg.pager.mode = mode;
  cfg.pager.slots_per_layer = cap;
  cfg.dense_dtype = dense;
  cfg.max_batch_tokens = 12;  // prompts in chunks, mixed with other requests' decodes
  cfg.max_running = 3;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 2 << 20};
  return cfg;
}

class ServeDecodeFusionEngine : public CudaTest, public ::testing::WithParamInterface<const char*> {
 protected:
  void TearDown() override {
    kernels::cuda::override_decode_fusion_for_tests(-1);
    CudaTest::TearDown();
  }
};

// The runner asks for the fusions when it is created: an engine made with them off runs the
// unfused launches (the reference twin), one made with them on the fused ones; 3 concurrent
// requests with chunked prefill (m <= 4 chunks take the fused GEMMs too) and decode graphs.
TEST_P(ServeDecodeFusionEngine, FusedRunnerGivesTheUnfusedBits) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  struct Case {
    ExpertMode mode;
    int cap;
    DType dense;
    const char* name;
  };
  std::vector<Case> cases = {{ExpertMode::kResident, 0, DType::kF32, "resident, f32 dense"},
                             {ExpertMode::kResident, 0, DType::kBF16, "resident, bf16 dense"}};
  if (m.geometry.experts > 0) {
    cases.push_back({ExpertMode::kPaged, m.geometry.top_k + 1, DType::kBF16, "paged, bf16 dense"});
  }
  for (const Case& c : cases) {
    const std::string what = fmt::format("{} {}", GetParam(), c.name);
    using kernels::cuda::DecodeFusion;
    constexpr int kKinds = kernels::cuda::kDecodeFusions;
    const DecodeFusion kinds[kKinds] = {DecodeFusion::kQkv, DecodeFusion::kAddNorm,
                                        DecodeFusion::kQkNormRope, DecodeFusion::kQkNormRopeKv};
    // Runs: 0 every fusion off (the reference), 1 all on (the default), 2 all on but the KV write
    // in the q/k norm + rope launch (the session-12 path: that launch, then kv_write).
    constexpr int kRuns = 3;
    const unsigned off_mask[kRuns] = {0u, 0u,
                                      1u << static_cast<unsigned>(DecodeFusion::kQkNormRopeKv)};
    testing::RunRecord rec[kRuns];
    std::uint64_t replays[kRuns] = {}, calls[kRuns][kKinds] = {};
    for (int run = 0; run < kRuns; ++run) {
      kernels::cuda::override_decode_fusion_for_tests(run == 0 ? 0 : 1, off_mask[run]);
      std::uint64_t before[kKinds];
      for (int k = 0; k < kKinds; ++k) before[k] = kernels::cuda::decode_fusion_calls(kinds[k]);
      auto eng =
          Engine::create(m.geometry, m.params, engine_config(c.mode, c.cap, c.dense), cuda());
      ASSERT_TRUE(eng.ok()) << what << ": " << eng.status().to_string();
      auto r = testing::run_engine(**eng, testing::mixed_requests(m.geometry.vocab));
      ASSERT_TRUE(r.ok()) << what << ": " << r.status().to_string();
      rec[run] = std::move(*r);
      replays[run] = (*eng)->graph_stats().replays;
      for (int k = 0; k < kKinds; ++k) {
        calls[run][k] = kernels::cuda::decode_fusion_calls(kinds[k]) - before[k];
      }
    }
    kernels::cuda::override_decode_fusion_for_tests(-1);
    ASSERT_FALSE(rec[0].logits.empty()) << what;
    testing::expect_same_bits(rec[1], rec[0], what + ": fused vs unfused");
    testing::expect_same_bits(rec[2], rec[0], what + ": fused but the KV write vs unfused");
    EXPECT_EQ(replays[1], replays[0]) << what;
    EXPECT_EQ(replays[2], replays[0]) << what;
    // The unfused engine never took a fused entry point; the fused ones took each that applies
    // (decode steps have <= 4 rows; eager steps count, graph replays do not re-enter the host);
    // run 2 never the KV-writing launch.
    for (int k = 0; k < kKinds; ++k) EXPECT_EQ(calls[0][k], 0u) << what << " fusion " << k;
    EXPECT_EQ(calls[2][3], 0u) << what << ": the KV-writing launch while switched off";
    for (int run = 1; run < kRuns; ++run) {
      EXPECT_GT(calls[run][0], 0u) << what << " run " << run << ": no fused q/k/v launch";
      EXPECT_GT(calls[run][1], 0u) << what << " run " << run << ": no fused add + rms_norm launch";
    }
    if (m.geometry.qk_norm == model::QkNorm::kPerHead && m.geometry.head_dim < 256 &&
        m.geometry.head_dim % 4 == 0) {
      EXPECT_GT(calls[1][2], 0u) << what << ": no fused q/k norm + rope launch";
      EXPECT_GT(calls[1][3], 0u) << what << ": no q/k norm + rope launch writing the KV cache";
      // Every fused q/k norm + rope of the default runner wrote the cache in the same launch.
      EXPECT_EQ(calls[1][3], calls[1][2]) << what;
      EXPECT_GT(calls[2][2], 0u) << what << ": no fused q/k norm + rope launch (KV write off)";
    } else {
      EXPECT_EQ(calls[1][3], 0u) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ServeDecodeFusionEngine,
                         ::testing::Values("qwen3_moe", "qwen3", "qwen2", "mixtral", "olmoe",
                                           "llama"));

}  // namespace
}  // namespace ferry::serve
