// SPDX-License-Identifier: Apache-2.0
// CUDA router (+bwd), MoE dispatch/combine (+bwd) and fused chunked cross-entropy vs the
// reference backend (f64), tolerance rule of style.md. Dispatch is exact (a permutation); combine
// is bitwise deterministic and each token's row does not depend on the other tokens in the batch.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "tests/gpu/gpu_test_util.h"

namespace ferry::testing {
namespace {

using kernels::reference_backend;
constexpr DType kBf = DType::kBF16;
constexpr DType kF64 = DType::kF64;
constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;

class KernelsMoe : public CudaTest {};

TEST_F(KernelsMoe, RouterForwardBackward) {
  for (auto [t, e, k, renorm] :
       std::vector<std::tuple<std::int64_t, std::int64_t, int, bool>>{{1, 1, 1, false},
                                                                      {7, 8, 2, true},
                                                                      {100, 64, 8, true},
                                                                      {33, 60, 4, false},
                                                                      {257, 128, 8, false}}) {
    const auto logits = random_tensor({t, e}, kBf, 60 + t, -3, 3);
    const auto dw = random_tensor({t, k}, kF32, 61);
    const auto l64 = converted(logits, kF64);
    HostTensor w_w({t, k}, kF32), ids_w({t, k}, kI32), p_w({t, e}, kF32), dl_w({t, e}, kF64);
    FERRY_ASSERT_OK(reference_backend().router({.weights = w_w.view(),
                                                .ids = ids_w.view(),
                                                .probs = p_w.view(),
                                                .logits = l64.cview(),
                                                .top_k = k,
                                                .renormalize = renorm},
                                               mem::Stream::host()));
    FERRY_ASSERT_OK(reference_backend().router_backward({.d_logits = dl_w.view(),
                                                         .d_weights = dw.cview(),
                                                         .probs = p_w.cview(),
                                                         .ids = ids_w.cview(),
                                                         .top_k = k,
                                                         .renormalize = renorm},
                                                        mem::Stream::host()));
    DeviceTensor dl(logits), ddw(dw), gw(std::vector<std::int64_t>{t, k}, kF32),
        gids(std::vector<std::int64_t>{t, k}, kI32), gp(std::vector<std::int64_t>{t, e}, kF32),
        gdl(std::vector<std::int64_t>{t, e}, kF32);
    FERRY_ASSERT_OK(cuda().router({.weights = gw.view(),
                                   .ids = gids.view(),
                                   .probs = gp.view(),
                                   .logits = dl.cview(),
                                   .top_k = k,
                                   .renormalize = renorm},
                                  stream()));
    FERRY_ASSERT_OK(cuda().router_backward({.d_logits = gdl.view(),
                                            .d_weights = ddw.cview(),
                                            .probs = gp.cview(),
                                            .ids = gids.cview(),
                                            .top_k = k,
                                            .renormalize = renorm},
                                           stream()));
    sync();
    EXPECT_TRUE(same_bits(gids.download(), ids_w)) << t << " " << e << " " << k;
    // f32 outputs of short f32 sums: a few ulps.
    EXPECT_LE(max_abs_diff(gp.download(), p_w), 1e-6);
    EXPECT_LE(max_abs_diff(gw.download(), w_w), 2e-6);
    EXPECT_LE(max_abs_diff(gdl.download(), dl_w), 1e-6 * (max_abs(dl_w) + 1.0) * k);
  }
}

TEST_F(KernelsMoe, DispatchCombineForwardBackward) {
  for (auto [t, k, c, e] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>>{
           {1, 1, 1, 1}, {9, 2, 33, 4}, {300, 8, 256, 64}, {1000, 2, 128, 7}}) {
    const auto x = random_tensor({t, c}, kBf, 70 + t);
    HostTensor ids({t, k}, kI32);
    std::mt19937_64 rng(71 + t);
    for (std::int64_t i = 0; i < t; ++i) {  // k distinct experts per token
      std::vector<int> perm(static_cast<std::size_t>(e));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (std::int64_t j = 0; j < k; ++j)
        ids.set(i * k + j, perm[static_cast<std::size_t>(j % e)]);
    }
    const auto w = random_tensor({t, k}, kF32, 72, 0, 1);
    const auto eo = random_tensor({t * k, c}, kBf, 73), dy = random_tensor({t, c}, kBf, 74),
               dg = random_tensor({t * k, c}, kBf, 75);
    const auto x64 = converted(x, kF64), eo64 = converted(eo, kF64), dy64 = converted(dy, kF64),
               dg64 = converted(dg, kF64);
    HostTensor g_w({t * k, c}, kF64), off_w({e + 1}, kI32), slot_w({t, k}, kI32),
        out_w({t, c}, kF64), deo_w({t * k, c}, kF64), dw_w({t, k}, kF32), dx_w({t, c}, kF64);
    FERRY_ASSERT_OK(reference_backend().moe_dispatch({.gathered = g_w.view(),
                                                      .expert_offsets = off_w.view(),
                                                      .slot_of = slot_w.view(),
                                                      .x = x64.cview(),
                                                      .ids = ids.cview(),
                                                      .num_experts = static_cast<int>(e)},
                                                     mem::Stream::host()));
    FERRY_ASSERT_OK(reference_backend().moe_combine({.out = out_w.view(),
                                                     .expert_out = eo64.cview(),
                                                     .weights = w.cview(),
                                                     .slot_of = slot_w.cview()},
                                                    mem::Stream::host()));
    FERRY_ASSERT_OK(reference_backend().moe_combine_backward({.d_expert_out = deo_w.view(),
                                                              .d_weights = dw_w.view(),
                                                              .d_out = dy64.cview(),
                                                              .expert_out = eo64.cview(),
                                                              .weights = w.cview(),
                                                              .slot_of = slot_w.cview()},
                                                             mem::Stream::host()));
    FERRY_ASSERT_OK(reference_backend().moe_dispatch_backward(
        {.d_x = dx_w.view(), .d_gathered = dg64.cview(), .slot_of = slot_w.cview()},
        mem::Stream::host()));

    DeviceTensor dx(x), dids(ids), dwt(w), deo(eo), ddy(dy), ddg(dg),
        gg(std::vector<std::int64_t>{t * k, c}, kBf), goff(std::vector<std::int64_t>{e + 1}, kI32),
        gslot(std::vector<std::int64_t>{t, k}, kI32), gout(std::vector<std::int64_t>{t, c}, kBf),
        gdeo(std::vector<std::int64_t>{t * k, c}, kBf), gdw(std::vector<std::int64_t>{t, k}, kF32),
        gdx(HostTensor({t, c}, kF32));
    FERRY_ASSERT_OK(cuda().moe_dispatch({.gathered = gg.view(),
                                         .expert_offsets = goff.view(),
                                         .slot_of = gslot.view(),
                                         .x = dx.cview(),
                                         .ids = dids.cview(),
                                         .num_experts = static_cast<int>(e)},
                                        stream()));
    FERRY_ASSERT_OK(cuda().moe_combine({.out = gout.view(),
                                        .expert_out = deo.cview(),
                                        .weights = dwt.cview(),
                                        .slot_of = gslot.cview()},
                                       stream()));
    FERRY_ASSERT_OK(cuda().moe_combine_backward({.d_expert_out = gdeo.view(),
                                                 .d_weights = gdw.view(),
                                                 .d_out = ddy.cview(),
                                                 .expert_out = deo.cview(),
                                                 .weights = dwt.cview(),
                                                 .slot_of = gslot.cview()},
                                                stream()));
    sync();
    EXPECT_TRUE(same_bits(goff.download(), off_w));
    EXPECT_TRUE(same_bits(gslot.download(), slot_w));
    EXPECT_TRUE(same_bits(gg.download(), converted(g_w, kBf)));
    const auto out1 = gout.download();
    EXPECT_TRUE(within_twice_naive(out1, out_w, rounded_to(out_w, kBf), 1e-6));
    EXPECT_TRUE(within_twice_naive(gdeo.download(), deo_w, rounded_to(deo_w, kBf), 1e-6));
    EXPECT_LE(max_abs_diff(gdw.download(), dw_w), 1e-6 * static_cast<double>(c));
    // dispatch backward in f32 (the d_x dtype follows d_gathered, so run a f32 copy).
    DeviceTensor ddg32(converted(dg, kF32));
    FERRY_ASSERT_OK(cuda().moe_dispatch_backward(
        {.d_x = gdx.view(), .d_gathered = ddg32.cview(), .slot_of = gslot.cview()}, stream()));
    // Combine again: bitwise identical; and token 0 alone gives the same row.
    DeviceTensor gout2(std::vector<std::int64_t>{t, c}, kBf);
    FERRY_ASSERT_OK(cuda().moe_combine({.out = gout2.view(),
                                        .expert_out = deo.cview(),
                                        .weights = dwt.cview(),
                                        .slot_of = gslot.cview()},
                                       stream()));
    sync();
    EXPECT_LE(max_abs_diff(gdx.download(), dx_w), 1e-6 * static_cast<double>(k));
    EXPECT_TRUE(same_bits(out1, gout2.download()));
  }
}

TEST_F(KernelsMoe, FusedCrossEntropyChunked) {
  for (auto [t, c, v, chunk] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, int>>{
           {1, 8, 5, 256}, {37, 64, 1000, 16}, {130, 128, 5003, 64}}) {
    const auto hid = random_tensor({t, c}, kBf, 80 + t),
               w = random_tensor({v, c}, kBf, 81, -0.5, 0.5);
    auto tg = random_ids(t, v, 82);
    if (t > 3) tg.set(2, -100);
    const float scale = 1.0f / static_cast<float>(t);
    const auto hid64 = converted(hid, kF64), w64 = converted(w, kF64);
    HostTensor nll_w({t}, kF32), dh_w({t, c}, kF64), dw_w({v, c}, kF64);
    kernels::CrossEntropyArgs ra{.nll = nll_w.view(),
                                 .d_hidden = dh_w.view(),
                                 .d_weight = dw_w.view(),
                                 .hidden = hid64.cview(),
                                 .weight = w64.cview(),
                                 .targets = tg.cview(),
                                 .chunk_tokens = chunk,
                                 .grad_scale = scale};
    HostTensor ws_ref({static_cast<std::int64_t>(reference_backend().workspace_bytes(ra))},
                      DType::kU8);
    ra.workspace = ws_ref.view();
    FERRY_ASSERT_OK(reference_backend().cross_entropy(ra, mem::Stream::host()));

    DeviceTensor dh(hid), dwt(w), dtg(tg), gnll(std::vector<std::int64_t>{t}, kF32),
        gdh(std::vector<std::int64_t>{t, c}, kBf), gdw(HostTensor({v, c}, kF32));
    kernels::CrossEntropyArgs ca{.nll = gnll.view(),
                                 .d_hidden = gdh.view(),
                                 .d_weight = gdw.view(),
                                 .hidden = dh.cview(),
                                 .weight = dwt.cview(),
                                 .targets = dtg.cview(),
                                 .chunk_tokens = chunk,
                                 .grad_scale = scale};
    DeviceTensor ws(
        std::vector<std::int64_t>{static_cast<std::int64_t>(cuda().workspace_bytes(ca))},
        DType::kU8);
    ca.workspace = ws.view();
    FERRY_ASSERT_OK(cuda().cross_entropy(ca, stream()));
    sync();
    // naive same precision: f32 logits from bf16 inputs, f32 softmax, bf16 d_logits, f32 GEMMs.
    HostTensor nll_n({t}, kF64), dh_n({t, c}, kF64), dw_n({v, c}, kF64);
    std::vector<float> dw_acc(static_cast<std::size_t>(v * c), 0.0f);
    for (std::int64_t i = 0; i < t; ++i) {
      std::vector<float> lg(static_cast<std::size_t>(v));
      float mx = -INFINITY;
      for (std::int64_t j = 0; j < v; ++j) {
        float acc = 0.0f;
        for (std::int64_t x = 0; x < c; ++x)
          acc += static_cast<float>(hid.get(i * c + x) * w.get(j * c + x));
        lg[j] = acc;
        mx = std::max(mx, acc);
      }
      float sum = 0.0f;
      for (float l : lg) sum += std::exp(l - mx);
      const auto target = static_cast<std::int64_t>(tg.get(i));
      const bool ign = target == -100;
      nll_n.set(i, ign ? 0.0 : mx + std::log(sum) - lg[target]);
      std::vector<float> dl(static_cast<std::size_t>(v), 0.0f);
      if (!ign)
        for (std::int64_t j = 0; j < v; ++j)
          dl[j] = bf16_to_f32(f32_to_bf16((std::exp(lg[j] - mx) / sum - (j == target)) * scale));
      for (std::int64_t x = 0; x < c; ++x) {
        float acc = 0.0f;
        for (std::int64_t j = 0; j < v; ++j) acc += dl[j] * static_cast<float>(w.get(j * c + x));
        dh_n.set(i * c + x, bf16_to_f32(f32_to_bf16(acc)));
      }
      for (std::int64_t j = 0; j < v; ++j)
        for (std::int64_t x = 0; x < c; ++x)
          dw_acc[j * c + x] += dl[j] * static_cast<float>(hid.get(i * c + x));
    }
    for (std::int64_t i = 0; i < v * c; ++i) dw_n.set(i, dw_acc[static_cast<std::size_t>(i)]);
    const std::string what =
        "t=" + std::to_string(t) + " c=" + std::to_string(c) + " v=" + std::to_string(v);
    EXPECT_TRUE(within_twice_naive(gnll.download(), nll_w, nll_n, 1e-5)) << "nll " << what;
    EXPECT_TRUE(within_twice_naive(gdh.download(), dh_w, dh_n, 1e-6)) << "d_hidden " << what;
    EXPECT_TRUE(within_twice_naive(gdw.download(), dw_w, dw_n, 1e-7)) << "d_weight " << what;
  }
}

}  // namespace
}  // namespace ferry::testing
