// SPDX-License-Identifier: Apache-2.0
// MoE dispatch / combine and their backwards: a hand-sorted dispatch, CPU == reference bytes for
// dispatch on E/K = 8/2, 4/1, 60/4, dispatch -> identity experts -> combine reproduces x, the
// combine's fixed k order (an order-sensitive case and byte identity under a different expert
// placement), finite differences of the f64 reference backwards, CPU vs reference, bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/backend.h"
#include "mem/stream.h"
#include "unit/kernels/kernel_test_util.h"

namespace ferry::kernels {
namespace {

using testing::HostTensor;

struct Dispatched {
  HostTensor gathered, offsets, slot_of;
};

Result<Dispatched> dispatch(Backend& be, const HostTensor& x, const HostTensor& ids, int E) {
  const std::int64_t T = x.shape()[0], C = x.shape()[1], K = ids.shape()[1];
  Dispatched d{HostTensor({T * K, C}, x.dtype()), HostTensor({E + 1}, DType::kI32),
               HostTensor({T, K}, DType::kI32)};
  MoeDispatchArgs a;
  a.gathered = d.gathered.view();
  a.expert_offsets = d.offsets.view();
  a.slot_of = d.slot_of.view();
  a.x = x.cview();
  a.ids = ids.cview();
  a.num_experts = E;
  FERRY_TRY(be.moe_dispatch(a, mem::Stream::host()));
  return d;
}

Status combine(Backend& be, const HostTensor& expert_out, const HostTensor& w,
               const HostTensor& slot_of, HostTensor& out) {
  MoeCombineArgs a;
  a.out = out.view();
  a.expert_out = expert_out.cview();
  a.weights = w.cview();
  a.slot_of = slot_of.cview();
  return be.moe_combine(a, mem::Stream::host());
}

Status combine_backward(Backend& be, const HostTensor& d_out, const HostTensor& expert_out,
                        const HostTensor& w, const HostTensor& slot_of, HostTensor& d_expert_out,
                        HostTensor& d_w) {
  MoeCombineBackwardArgs a;
  a.d_expert_out = d_expert_out.view();
  a.d_weights = d_w.view();
  a.d_out = d_out.cview();
  a.expert_out = expert_out.cview();
  a.weights = w.cview();
  a.slot_of = slot_of.cview();
  return be.moe_combine_backward(a, mem::Stream::host());
}

Status dispatch_backward(Backend& be, const HostTensor& d_gathered, const HostTensor& slot_of,
                         HostTensor& d_x) {
  MoeDispatchBackwardArgs a;
  a.d_x = d_x.view();
  a.d_gathered = d_gathered.cview();
  a.slot_of = slot_of.cview();
  return be.moe_dispatch_backward(a, mem::Stream::host());
}

// Distinct ids per row drawn from [0, E) (a top-k never repeats an expert).
HostTensor random_topk_ids(std::int64_t T, std::int64_t K, std::int64_t E, std::uint64_t seed) {
  HostTensor ids({T, K}, DType::kI32);
  const HostTensor r = testing::random_ids(T * K * 4, E, seed);
  std::int64_t next = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t k = 0; k < K; ++k) {
      for (;;) {
        const double e = next < r.numel() ? r.get(next++) : static_cast<double>((t + k) % E);
        bool dup = false;
        for (std::int64_t j = 0; j < k; ++j) dup = dup || ids.get(t * K + j) == e;
        if (!dup) {
          ids.set(t * K + k, e);
          break;
        }
        if (next >= r.numel()) next = 0;  // fall back to scanning the pool again
      }
    }
  }
  return ids;
}

// T = 3, K = 2, E = 3, ids = [[2, 0], [0, 2], [1, 0]]. Sorting (token, k) by expert, stable:
//   expert 0: (0,1) (1,0) (2,1) -> rows 0, 1, 2;  expert 1: (2,0) -> row 3;
//   expert 2: (0,0) (1,1) -> rows 4, 5.
// So expert_offsets = [0, 3, 4, 6] and slot_of = [[4, 0], [1, 5], [3, 2]].
TEST(MoeDispatch, HandSortedCase) {
  const HostTensor ids = testing::from_values({3, 2}, DType::kI32, {2, 0, 0, 2, 1, 0});
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    const HostTensor x = testing::from_values({3, 2}, DType::kF32, {10, 11, 20, 21, 30, 31});
    auto d = dispatch(*be, x, ids, 3);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    const std::vector<int> offsets = {0, 3, 4, 6}, slots = {4, 0, 1, 5, 3, 2};
    for (int e = 0; e < 4; ++e) EXPECT_EQ(d->offsets.get(e), offsets[e]) << be->name();
    for (int i = 0; i < 6; ++i) EXPECT_EQ(d->slot_of.get(i), slots[i]) << be->name();
    for (int i = 0; i < 6; ++i) {  // row slots[i] holds token i / 2
      EXPECT_EQ(d->gathered.get(slots[i] * 2), x.get((i / 2) * 2)) << be->name();
      EXPECT_EQ(d->gathered.get(slots[i] * 2 + 1), x.get((i / 2) * 2 + 1)) << be->name();
    }
  }
}

struct EkCase {
  std::int64_t T, E, K, C;
};
const EkCase kCases[] = {{1, 8, 2, 5}, {13, 8, 2, 16}, {7, 4, 1, 3}, {31, 60, 4, 9}};

TEST(MoeDispatch, CpuEqualsReferenceExactly) {
  for (const EkCase c : kCases) {
    const auto seed = static_cast<std::uint64_t>(c.T * 7 + c.E);
    const HostTensor x = testing::random_tensor({c.T, c.C}, DType::kF32, seed);
    const HostTensor ids = random_topk_ids(c.T, c.K, c.E, seed + 1);
    auto want = dispatch(reference_backend(), x, ids, static_cast<int>(c.E));
    auto got = dispatch(cpu_backend(), x, ids, static_cast<int>(c.E));
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(testing::max_abs_diff(got->offsets, want->offsets), 0.0) << "E=" << c.E;
    EXPECT_EQ(testing::max_abs_diff(got->slot_of, want->slot_of), 0.0) << "E=" << c.E;
    EXPECT_EQ(testing::max_abs_diff(got->gathered, want->gathered), 0.0) << "E=" << c.E;
  }
}

// Identity experts: expert_out = gathered. With dyadic weights each fma step is exact
// (w x for w in {1/8, 1/8, 1/4, 1/2} is exact, and the partial sums x/8, x/4, x/2, x are exact),
// so out == x bit for bit; with router-style weights (renormalised softmax) the sum of K
// rounded products is within K roundings of x, plus |sum w - 1| <= K ulps.
TEST(MoeCombine, IdentityExpertsReproduceInput) {
  for (const EkCase c : kCases) {
    for (Backend* be : {&reference_backend(), &cpu_backend()}) {
      const auto seed = static_cast<std::uint64_t>(c.T * 3 + c.K);
      const HostTensor x = testing::random_tensor({c.T, c.C}, DType::kF32, seed);
      const HostTensor ids = random_topk_ids(c.T, c.K, c.E, seed + 1);
      auto d = dispatch(*be, x, ids, static_cast<int>(c.E));
      ASSERT_TRUE(d.ok());
      HostTensor w({c.T, c.K}, DType::kF32), out({c.T, c.C}, DType::kF32);
      const std::vector<double> dyadic = c.K == 4   ? std::vector<double>{0.125, 0.125, 0.25, 0.5}
                                         : c.K == 2 ? std::vector<double>{0.25, 0.75}
                                                    : std::vector<double>{1.0};
      for (std::int64_t i = 0; i < c.T * c.K; ++i) w.set(i, dyadic[i % c.K]);
      FERRY_ASSERT_OK(combine(*be, d->gathered, w, d->slot_of, out));
      EXPECT_EQ(testing::max_abs_diff(out, x), 0.0) << be->name() << " K=" << c.K;

      HostTensor rw = testing::random_tensor({c.T, c.K}, DType::kF32, seed + 2, 0.1, 1.0);
      for (std::int64_t t = 0; t < c.T; ++t) {
        float s = 0.0f;
        for (std::int64_t k = 0; k < c.K; ++k) s += static_cast<float>(rw.get(t * c.K + k));
        for (std::int64_t k = 0; k < c.K; ++k) rw.set(t * c.K + k, rw.get(t * c.K + k) / s);
      }
      FERRY_ASSERT_OK(combine(*be, d->gathered, rw, d->slot_of, out));
      const double tol = 4.0 * c.K * testing::eps_of(DType::kF32);
      EXPECT_TRUE(testing::all_close(out, x, 0.0, tol)) << be->name() << " K=" << c.K;
    }
  }
}

// The sum runs k = 0..K-1 in f32 (ops.h). One token, C = 1, weights 1, rows [1, 1e8, -1e8]:
//   k order: 1 + 1e8 = 100000001 is not a float (spacing 8 at 1e8) -> 1e8; then 1e8 - 1e8 = 0.
//   reverse order: -1e8 + 1e8 = 0, then + 1 = 1;  the f64 reference keeps the 1 as well.
// So the CPU must give exactly 0 and the reference exactly 1.
TEST(MoeCombine, SumsInRoutingOrder) {
  const HostTensor rows = testing::from_values({3, 1}, DType::kF32, {1, 1e8, -1e8});
  const HostTensor w = testing::from_values({1, 3}, DType::kF32, {1, 1, 1});
  const HostTensor slots = testing::from_values({1, 3}, DType::kI32, {0, 1, 2});
  HostTensor out({1, 1}, DType::kF32);
  FERRY_ASSERT_OK(combine(cpu_backend(), rows, w, slots, out));
  EXPECT_EQ(out.get(0), 0.0);
  HostTensor out64({1, 1}, DType::kF64);
  FERRY_ASSERT_OK(
      combine(reference_backend(), testing::converted(rows, DType::kF64), w, slots, out64));
  EXPECT_EQ(out64.get(0), 1.0);
}

// CPU combine == the fma chain k = 0..K-1 computed here, bit for bit; and moving the expert rows
// to other slots (a different placement of experts) gives the same bytes.
TEST(MoeCombine, CpuIsFmaChainAndPlacementIndependent) {
  const std::int64_t T = 11, K = 4, C = 37;  // C not a multiple of the SIMD width
  const HostTensor rows = testing::random_tensor({T * K, C}, DType::kF32, 5, -3.0, 3.0);
  const HostTensor w = testing::random_tensor({T, K}, DType::kF32, 6);
  HostTensor slots({T, K}, DType::kI32), moved_slots({T, K}, DType::kI32);
  HostTensor moved_rows({T * K, C}, DType::kF32);
  for (std::int64_t i = 0; i < T * K; ++i) {
    slots.set(i, (i * 7) % (T * K));  // 7 is coprime to 44: a permutation
    const std::int64_t moved = T * K - 1 - (i * 7) % (T * K);
    moved_slots.set(i, moved);
    for (std::int64_t c = 0; c < C; ++c) {
      moved_rows.set(moved * C + c, rows.get(((i * 7) % (T * K)) * C + c));
    }
  }
  HostTensor out({T, C}, DType::kF32), moved_out({T, C}, DType::kF32);
  FERRY_ASSERT_OK(combine(cpu_backend(), rows, w, slots, out));
  FERRY_ASSERT_OK(combine(cpu_backend(), moved_rows, w, moved_slots, moved_out));
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < K; ++k) {
        acc = std::fma(static_cast<float>(w.get(t * K + k)),
                       static_cast<float>(rows.get(slots.get(t * K + k) * C + c)), acc);
      }
      ASSERT_EQ(static_cast<float>(out.get(t * C + c)), acc) << "t=" << t << " c=" << c;
      ASSERT_EQ(moved_out.get(t * C + c), out.get(t * C + c)) << "t=" << t << " c=" << c;
    }
  }
}

// Finite differences (f64 reference): combine w.r.t. expert_out and weights, dispatch w.r.t. x.
TEST(MoeReference, GradientsMatchFiniteDifferences) {
  Backend& ref = reference_backend();
  const std::int64_t T = 5, K = 2, E = 4, C = 3;
  HostTensor x = testing::random_tensor({T, C}, DType::kF64, 1);
  const HostTensor ids = random_topk_ids(T, K, E, 2);
  auto d = dispatch(ref, x, ids, E);
  ASSERT_TRUE(d.ok());
  HostTensor expert_out = testing::random_tensor({T * K, C}, DType::kF64, 3);
  HostTensor w = testing::random_tensor({T, K}, DType::kF64, 4);
  const HostTensor proj = testing::random_tensor({T, C}, DType::kF64, 5);
  HostTensor out({T, C}, DType::kF64), d_rows({T * K, C}, DType::kF64), d_w({T, K}, DType::kF64);
  FERRY_ASSERT_OK(combine_backward(ref, proj, expert_out, w, d->slot_of, d_rows, d_w));
  auto combine_loss = [&] {
    FERRY_CHECK_OK(combine(ref, expert_out, w, d->slot_of, out));
    return testing::dot(out, proj);
  };
  EXPECT_TRUE(testing::check_gradient(expert_out, d_rows, combine_loss));
  EXPECT_TRUE(testing::check_gradient(w, d_w, combine_loss));

  // dispatch: L = sum(gathered * gproj); d_x accumulates onto its initial value.
  const HostTensor gproj = testing::random_tensor({T * K, C}, DType::kF64, 6);
  const HostTensor init = testing::random_tensor({T, C}, DType::kF64, 7);
  HostTensor d_x = init;
  FERRY_ASSERT_OK(dispatch_backward(ref, gproj, d->slot_of, d_x));
  HostTensor grad({T, C}, DType::kF64);
  for (std::int64_t i = 0; i < T * C; ++i) grad.set(i, d_x.get(i) - init.get(i));
  auto dispatch_loss = [&] {
    auto r = dispatch(ref, x, ids, E);
    FERRY_CHECK(r.ok(), "dispatch failed");
    return testing::dot(r->gathered, gproj);
  };
  EXPECT_TRUE(testing::check_gradient(x, grad, dispatch_loss));
}

// CPU backwards vs the f64 reference (llm.c rule). dispatch_backward adds K + 1 f32 terms and
// combine_backward's d_weights is a C-term f32 dot: bounds of (K + 1) and C roundings of the
// summed magnitudes, taken generously as 8 * terms * 2^-24 relative plus the same absolute.
TEST(MoeCpu, BackwardsMatchReference) {
  for (const EkCase c : kCases) {
    const auto seed = static_cast<std::uint64_t>(c.T * 11 + c.E);
    const HostTensor x = testing::random_tensor({c.T, c.C}, DType::kF32, seed);
    const HostTensor ids = random_topk_ids(c.T, c.K, c.E, seed + 1);
    auto d = dispatch(cpu_backend(), x, ids, static_cast<int>(c.E));
    ASSERT_TRUE(d.ok());
    const HostTensor eo = testing::random_tensor({c.T * c.K, c.C}, DType::kF32, seed + 2);
    const HostTensor w = testing::random_tensor({c.T, c.K}, DType::kF32, seed + 3);
    const HostTensor g = testing::random_tensor({c.T, c.C}, DType::kF32, seed + 4);
    HostTensor dr32({c.T * c.K, c.C}, DType::kF32), dw32({c.T, c.K}, DType::kF32);
    HostTensor dr64({c.T * c.K, c.C}, DType::kF64), dw64({c.T, c.K}, DType::kF64);
    FERRY_ASSERT_OK(combine_backward(cpu_backend(), g, eo, w, d->slot_of, dr32, dw32));
    FERRY_ASSERT_OK(combine_backward(reference_backend(), g, eo, w, d->slot_of, dr64, dw64));
    const double u = testing::eps_of(DType::kF32);
    EXPECT_TRUE(testing::all_close(dr32, dr64, u, u));  // one product: one rounding
    EXPECT_TRUE(testing::all_close(dw32, dw64, 8.0 * c.C * u, 8.0 * c.C * u));
    HostTensor out32({c.T, c.C}, DType::kF32), out64({c.T, c.C}, DType::kF64);
    FERRY_ASSERT_OK(combine(cpu_backend(), eo, w, d->slot_of, out32));
    FERRY_ASSERT_OK(combine(reference_backend(), eo, w, d->slot_of, out64));
    EXPECT_TRUE(testing::all_close(out32, out64, 8.0 * c.K * u, 8.0 * c.K * u));

    const HostTensor init = testing::random_tensor({c.T, c.C}, DType::kF32, seed + 5);
    HostTensor dx32 = init;
    HostTensor dx64 = testing::converted(init, DType::kF64);
    FERRY_ASSERT_OK(dispatch_backward(cpu_backend(), eo, d->slot_of, dx32));
    FERRY_ASSERT_OK(dispatch_backward(reference_backend(), eo, d->slot_of, dx64));
    EXPECT_TRUE(testing::all_close(dx32, dx64, 8.0 * (c.K + 1) * u, 8.0 * (c.K + 1) * u));
  }
}

TEST(Moe, BadInputsReturnStatus) {
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    const HostTensor x = testing::random_tensor({3, 4}, DType::kF32, 1);
    HostTensor ids = testing::from_values({3, 2}, DType::kI32, {0, 1, 2, 3, 1, 0});
    EXPECT_EQ(dispatch(*be, x, ids, 3).status().code(), StatusCode::kInvalidArgument);  // id 3
    EXPECT_EQ(dispatch(*be, x, ids, 0).status().code(), StatusCode::kInvalidArgument);
    ids.set(3, -1);
    EXPECT_EQ(dispatch(*be, x, ids, 4).status().code(), StatusCode::kInvalidArgument);
    ids.set(3, 2);
    auto d = dispatch(*be, x, ids, 4);
    ASSERT_TRUE(d.ok());
    HostTensor w = testing::random_tensor({3, 2}, DType::kF32, 2), out({3, 4}, DType::kF32);
    d->slot_of.set(2, 6);  // outside [0, T*K)
    EXPECT_EQ(combine(*be, d->gathered, w, d->slot_of, out).code(), StatusCode::kInvalidArgument);
    HostTensor d_x({3, 4}, DType::kF32);
    EXPECT_EQ(dispatch_backward(*be, d->gathered, d->slot_of, d_x).code(),
              StatusCode::kInvalidArgument);
    HostTensor wrong_rows({5, 4}, DType::kF32);
    d->slot_of.set(2, 1);
    EXPECT_EQ(combine(*be, wrong_rows, w, d->slot_of, out).code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace ferry::kernels
