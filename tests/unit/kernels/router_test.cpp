// SPDX-License-Identifier: Apache-2.0
// MoE router: a hand-computed case with ties, finite-difference gradients of the f64 reference
// (with and without renormalisation), the CPU backend against the reference on E/K = 8/2, 4/1,
// 60/4 with many exact ties, and bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/backend.h"
#include "mem/stream.h"
#include "unit/kernels/kernel_test_util.h"

namespace ferry::kernels {
namespace {

using testing::HostTensor;

struct RouterOut {
  HostTensor weights, ids, probs;
};

Result<RouterOut> run_router(Backend& be, const HostTensor& logits, int k, bool renorm,
                             DType out_dt) {
  const std::int64_t T = logits.shape()[0], E = logits.shape()[1];
  RouterOut r{HostTensor({T, k}, out_dt), HostTensor({T, k}, DType::kI32),
              HostTensor({T, E}, out_dt)};
  RouterArgs a;
  a.weights = r.weights.view();
  a.ids = r.ids.view();
  a.probs = r.probs.view();
  a.logits = logits.cview();
  a.top_k = k;
  a.renormalize = renorm;
  FERRY_TRY(be.router(a, mem::Stream::host()));
  return r;
}

Status run_router_backward(Backend& be, const RouterOut& fwd, const HostTensor& d_weights, int k,
                           bool renorm, HostTensor& d_logits) {
  RouterBackwardArgs a;
  a.d_logits = d_logits.view();
  a.d_weights = d_weights.cview();
  a.probs = fwd.probs.cview();
  a.ids = fwd.ids.cview();
  a.top_k = k;
  a.renormalize = renorm;
  return be.router_backward(a, mem::Stream::host());
}

// One token, E = 4, logits [0, ln 3, ln 2, ln 3]: e^logits = [1, 3, 2, 3], sum 9, so
// probs = [1/9, 1/3, 2/9, 1/3]. Experts 1 and 3 tie; the lower id comes first.
//   top-2: ids [1, 3], weights [1/3, 1/3]; renormalised by 2/3 -> [1/2, 1/2].
//   top-3: ids [1, 3, 2], weights [1/3, 1/3, 2/9]; renormalised by 8/9 -> [3/8, 3/8, 1/4].
TEST(Router, HandComputedWithTie) {
  struct Want {
    int k;
    bool renorm;
    std::vector<int> ids;
    std::vector<double> w;
  };
  const std::vector<Want> wants = {{2, false, {1, 3}, {1.0 / 3, 1.0 / 3}},
                                   {2, true, {1, 3}, {0.5, 0.5}},
                                   {3, false, {1, 3, 2}, {1.0 / 3, 1.0 / 3, 2.0 / 9}},
                                   {3, true, {1, 3, 2}, {3.0 / 8, 3.0 / 8, 0.25}}};
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    const DType dt = be == &reference_backend() ? DType::kF64 : DType::kF32;
    const double tol = dt == DType::kF64 ? 1e-15 : 3e-7;
    const HostTensor logits =
        testing::from_values({1, 4}, dt, {0, std::log(3.0), std::log(2.0), std::log(3.0)});
    for (const Want& w : wants) {
      auto r = run_router(*be, logits, w.k, w.renorm, dt);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      const std::vector<double> probs = {1.0 / 9, 1.0 / 3, 2.0 / 9, 1.0 / 3};
      for (int e = 0; e < 4; ++e) EXPECT_NEAR(r->probs.get(e), probs[e], tol) << be->name();
      for (int k = 0; k < w.k; ++k) {
        EXPECT_EQ(r->ids.get(k), w.ids[k]) << be->name() << " k=" << w.k << " slot " << k;
        EXPECT_NEAR(r->weights.get(k), w.w[k], tol) << be->name() << " renorm=" << w.renorm;
      }
    }
  }
}

// Finite differences of L = sum(weights * proj) with respect to the logits, f64 reference. The
// logits are uniform random, so no two are within h of each other and the top-k set is fixed.
void check_router_fd(std::int64_t T, std::int64_t E, int k, bool renorm, std::uint64_t seed) {
  Backend& ref = reference_backend();
  HostTensor logits = testing::random_tensor({T, E}, DType::kF64, seed, -2.0, 2.0);
  const HostTensor proj = testing::random_tensor({T, k}, DType::kF64, seed + 1);
  auto fwd = run_router(ref, logits, k, renorm, DType::kF64);
  ASSERT_TRUE(fwd.ok());
  HostTensor d_logits({T, E}, DType::kF64);
  FERRY_ASSERT_OK(run_router_backward(ref, *fwd, proj, k, renorm, d_logits));
  auto loss = [&] {
    auto r = run_router(ref, logits, k, renorm, DType::kF64);
    FERRY_CHECK(r.ok(), "router failed");
    // The top-k set must not change under the perturbation, or the loss is not differentiable.
    for (std::int64_t i = 0; i < T * k; ++i) FERRY_CHECK(r->ids.get(i) == fwd->ids.get(i), "ids");
    return testing::dot(r->weights, proj);
  };
  EXPECT_TRUE(testing::check_gradient(logits, d_logits, loss))
      << "E=" << E << " K=" << k << " renorm=" << renorm;
}

TEST(RouterReference, GradientsMatchFiniteDifferences) {
  check_router_fd(3, 8, 2, false, 1);
  check_router_fd(3, 8, 2, true, 2);
  check_router_fd(2, 4, 1, false, 3);
  check_router_fd(2, 4, 1, true, 4);  // K = 1 renormalised: weight is 1, gradient exactly 0
  check_router_fd(2, 60, 4, true, 5);
  check_router_fd(2, 60, 4, false, 6);
}

// Logits drawn from a 5-value grid so rows have many exact ties; both backends must pick the
// same ids and agree on weights/probs/d_logits under the llm.c rule. Tolerances: the CPU works in
// f32 (one exp and one divide per prob; d_logits = p (dp - p.dp) cancels O(1) terms), so a few
// f32 unit roundoffs (2^-24 ~ 6e-8) relative plus the same absolute.
TEST(RouterCpu, MatchesReferenceWithTies) {
  struct Case {
    std::int64_t T, E;
    int k;
  };
  for (const Case c : {Case{13, 8, 2}, Case{7, 4, 1}, Case{5, 60, 4}, Case{1, 60, 4}}) {
    for (bool renorm : {false, true}) {
      const std::uint64_t seed = static_cast<std::uint64_t>(c.T * 100 + c.E + c.k);
      HostTensor logits = testing::random_ids(c.T * c.E, 5, seed);
      HostTensor l32({c.T, c.E}, DType::kF32);
      for (std::int64_t i = 0; i < c.T * c.E; ++i) l32.set(i, 0.5 * logits.get(i) - 1.0);
      const HostTensor l64 = testing::converted(l32, DType::kF64);
      auto want = run_router(reference_backend(), l64, c.k, renorm, DType::kF64);
      auto got = run_router(cpu_backend(), l32, c.k, renorm, DType::kF32);
      ASSERT_TRUE(want.ok() && got.ok());
      for (std::int64_t i = 0; i < c.T * c.k; ++i) {
        ASSERT_EQ(got->ids.get(i), want->ids.get(i)) << "E=" << c.E << " K=" << c.k << " at " << i;
      }
      const double rtol = 8 * testing::eps_of(DType::kF32);
      EXPECT_TRUE(testing::all_close(got->probs, want->probs, rtol, rtol));
      EXPECT_TRUE(testing::all_close(got->weights, want->weights, rtol, rtol));

      const HostTensor dw32 = testing::random_tensor({c.T, c.k}, DType::kF32, seed + 3);
      HostTensor dl32({c.T, c.E}, DType::kF32), dl64({c.T, c.E}, DType::kF64);
      FERRY_ASSERT_OK(run_router_backward(cpu_backend(), *got, dw32, c.k, renorm, dl32));
      FERRY_ASSERT_OK(run_router_backward(
          reference_backend(), *want, testing::converted(dw32, DType::kF64), c.k, renorm, dl64));
      EXPECT_TRUE(testing::all_close(dl32, dl64, 4 * rtol, 4 * rtol))
          << "E=" << c.E << " K=" << c.k << " renorm=" << renorm;
    }
  }
}

TEST(Router, BadInputsReturnStatus) {
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    HostTensor logits = testing::random_tensor({3, 4}, DType::kF32, 9);
    EXPECT_EQ(run_router(*be, logits, 5, false, DType::kF32).status().code(),
              StatusCode::kInvalidArgument);  // top_k > E
    EXPECT_EQ(run_router(*be, logits, 0, false, DType::kF32).status().code(),
              StatusCode::kInvalidArgument);
    logits.set(5, std::nan(""));
    EXPECT_EQ(run_router(*be, logits, 2, false, DType::kF32).status().code(),
              StatusCode::kInvalidArgument);
    logits.set(5, 0.25);
    auto fwd = run_router(*be, logits, 2, true, DType::kF32);
    ASSERT_TRUE(fwd.ok());
    HostTensor dw = testing::random_tensor({3, 2}, DType::kF32, 10), dl({3, 4}, DType::kF32);
    FERRY_EXPECT_OK(run_router_backward(*be, *fwd, dw, 2, true, dl));
    fwd->ids.set(3, 4);  // out of [0, E)
    EXPECT_EQ(run_router_backward(*be, *fwd, dw, 2, true, dl).code(), StatusCode::kInvalidArgument);
    fwd->ids.set(3, fwd->ids.get(2));  // expert twice in one row
    EXPECT_EQ(run_router_backward(*be, *fwd, dw, 2, true, dl).code(), StatusCode::kInvalidArgument);
  }
  // The CPU backend computes in f32 only.
  const HostTensor l64 = testing::random_tensor({2, 4}, DType::kF64, 11);
  EXPECT_EQ(run_router(cpu_backend(), l64, 2, false, DType::kF64).status().code(),
            StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace ferry::kernels
