// SPDX-License-Identifier: Apache-2.0
// Fused lm_head + cross-entropy: a hand-computed 2-token 3-vocab case, finite differences of the
// f64 reference, chunk size (1, 3, T) does not change results, ignored targets, workspace sizing,
// bad inputs, and the CPU backend against the f64 reference under the FlashAttention rule with a
// naive f32 loop (float dots, float softmax) as the "same-precision naive" implementation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/backend.h"
#include "mem/stream.h"
#include "unit/kernels/kernel_test_util.h"

namespace ferry::kernels {
namespace {

using testing::HostTensor;

struct CeResult {
  HostTensor nll, d_hidden, d_weight;
};

struct CeOptions {
  int chunk = 256;
  float grad_scale = 1.0f;
  bool grads = true;
  int ignore_index = -100;
  std::int64_t workspace_delta = 0;  // bytes added to workspace_bytes() (negative: too small)
};

Result<CeResult> run_ce(Backend& be, const HostTensor& hidden, const HostTensor& weight,
                        const HostTensor& targets, const CeOptions& o,
                        const HostTensor* d_weight_init = nullptr) {
  const std::int64_t T = hidden.shape()[0], C = hidden.shape()[1], V = weight.shape()[0];
  const DType dt = hidden.dtype();
  CeResult r{HostTensor({T}, dt), HostTensor({T, C}, dt),
             d_weight_init ? *d_weight_init : HostTensor({V, C}, dt)};
  CrossEntropyArgs a;
  a.nll = r.nll.view();
  if (o.grads) {
    a.d_hidden = r.d_hidden.view();
    a.d_weight = r.d_weight.view();
  }
  a.hidden = hidden.cview();
  a.weight = weight.cview();
  a.targets = targets.cview();
  a.ignore_index = o.ignore_index;
  a.chunk_tokens = o.chunk;
  a.grad_scale = o.grad_scale;
  const auto ws_bytes = static_cast<std::int64_t>(be.workspace_bytes(a)) + o.workspace_delta;
  HostTensor ws({ws_bytes}, DType::kU8);
  a.workspace = ws.view();
  FERRY_TRY(be.cross_entropy(a, mem::Stream::host()));
  return r;
}

// T = 2, V = 3, C = 3, weight = identity, so logits = hidden; grad_scale = 0.5.
//   token 0: logits [0, 0, 0], target 1: softmax [1/3]*3, nll = log 3,
//            dlogit = 0.5 * [1/3, 1/3 - 1, 1/3] = [1/6, -1/3, 1/6].
//   token 1: logits [0, ln 2, ln 5], target 2: e^logits = [1, 2, 5], sum 8, nll = ln 8 - ln 5,
//            dlogit = 0.5 * [1/8, 2/8, 5/8 - 1] = [1/16, 1/8, -3/16].
//   d_hidden[t] = dlogit[t] @ I = dlogit[t].
//   d_weight[v, c] = sum_t dlogit[t, v] hidden[t, c]; hidden[0] = 0, so = dlogit[1, v] hidden[1,
//   c].
TEST(CrossEntropy, HandComputedTwoTokensThreeVocab) {
  const double ln2 = std::log(2.0), ln5 = std::log(5.0);
  const std::vector<double> dl0 = {1.0 / 6, -1.0 / 3, 1.0 / 6},
                            dl1 = {1.0 / 16, 1.0 / 8, -3.0 / 16};
  const std::vector<double> h1 = {0, ln2, ln5};
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    const DType dt = be == &reference_backend() ? DType::kF64 : DType::kF32;
    const double tol = dt == DType::kF64 ? 1e-14 : 1e-6;
    const HostTensor hidden = testing::from_values({2, 3}, dt, {0, 0, 0, 0, ln2, ln5});
    const HostTensor weight = testing::from_values({3, 3}, dt, {1, 0, 0, 0, 1, 0, 0, 0, 1});
    const HostTensor targets = testing::from_values({2}, DType::kI32, {1, 2});
    auto r = run_ce(*be, hidden, weight, targets, {.chunk = 1, .grad_scale = 0.5f});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_NEAR(r->nll.get(0), std::log(3.0), tol) << be->name();
    EXPECT_NEAR(r->nll.get(1), std::log(8.0) - ln5, tol) << be->name();
    for (int v = 0; v < 3; ++v) {
      EXPECT_NEAR(r->d_hidden.get(v), dl0[v], tol) << be->name();
      EXPECT_NEAR(r->d_hidden.get(3 + v), dl1[v], tol) << be->name();
      for (int c = 0; c < 3; ++c) {
        EXPECT_NEAR(r->d_weight.get(v * 3 + c), dl1[v] * h1[c], tol) << be->name();
      }
    }
  }
}

// Finite differences of L = sum_t grad_scale * nll[t] (one target ignored), f64 reference.
TEST(CrossEntropyReference, GradientsMatchFiniteDifferences) {
  Backend& ref = reference_backend();
  const std::int64_t T = 5, C = 4, V = 7;
  HostTensor hidden = testing::random_tensor({T, C}, DType::kF64, 1);
  HostTensor weight = testing::random_tensor({V, C}, DType::kF64, 2);
  const HostTensor targets = testing::from_values({T}, DType::kI32, {3, -100, 0, 6, 3});
  const CeOptions o{.chunk = 2, .grad_scale = 0.25f};
  auto r = run_ce(ref, hidden, weight, targets, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto loss = [&] {
    auto f = run_ce(ref, hidden, weight, targets, {.chunk = 2, .grads = false});
    FERRY_CHECK(f.ok(), "cross_entropy failed");
    double s = 0.0;
    for (std::int64_t t = 0; t < T; ++t) s += 0.25 * f->nll.get(t);
    return s;
  };
  EXPECT_TRUE(testing::check_gradient(hidden, r->d_hidden, loss)) << "d_hidden";
  EXPECT_TRUE(testing::check_gradient(weight, r->d_weight, loss)) << "d_weight";
}

// Chunking only changes how many rows are in flight. The reference computes each row the same
// way whatever the chunk (nll, d_hidden bit-identical; d_weight adds per-chunk f64 sums, so
// equal up to f64 reassociation of <= 7 terms of magnitude < 1: below 7 * 2^-53 ~ 8e-16, bounded
// by 1e-14). The CPU's sgemm may block differently for other row counts,
// so it gets the f32 bound of the CPU-vs-reference test (relative 1e-5 of O(1) values).
TEST(CrossEntropy, ChunkSizeDoesNotChangeResults) {
  const std::int64_t T = 7, C = 6, V = 11;
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    const DType dt = be == &reference_backend() ? DType::kF64 : DType::kF32;
    const HostTensor hidden = testing::random_tensor({T, C}, dt, 3);
    const HostTensor weight = testing::random_tensor({V, C}, dt, 4);
    const HostTensor targets = testing::from_values({T}, DType::kI32, {1, 0, 10, -100, 5, 5, 2});
    auto base = run_ce(*be, hidden, weight, targets, {.chunk = static_cast<int>(T)});
    ASSERT_TRUE(base.ok());
    for (int chunk : {1, 3, 1000}) {
      auto r = run_ce(*be, hidden, weight, targets, {.chunk = chunk});
      ASSERT_TRUE(r.ok());
      const double tol = dt == DType::kF64 ? 0.0 : 1e-5;
      EXPECT_TRUE(testing::all_close(r->nll, base->nll, tol, tol)) << be->name() << " " << chunk;
      EXPECT_TRUE(testing::all_close(r->d_hidden, base->d_hidden, tol, tol)) << be->name();
      const double wtol = dt == DType::kF64 ? 1e-14 : 1e-5;
      EXPECT_TRUE(testing::all_close(r->d_weight, base->d_weight, wtol, wtol)) << be->name();
    }
  }
}

// Ignored rows: nll 0, d_hidden row 0, and their hidden values do not reach d_weight (changing
// them leaves d_weight unchanged). All rows ignored: d_weight keeps its initial value.
TEST(CrossEntropy, IgnoredTargetsContributeNothing) {
  const std::int64_t T = 4, C = 5, V = 6;
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    const DType dt = be == &reference_backend() ? DType::kF64 : DType::kF32;
    HostTensor hidden = testing::random_tensor({T, C}, dt, 5);
    const HostTensor weight = testing::random_tensor({V, C}, dt, 6);
    const HostTensor targets = testing::from_values({T}, DType::kI32, {2, 7, 0, 7});
    const CeOptions o{.chunk = 3, .ignore_index = 7};
    auto r = run_ce(*be, hidden, weight, targets, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    for (std::int64_t t : {1, 3}) {
      EXPECT_EQ(r->nll.get(t), 0.0);
      for (std::int64_t c = 0; c < C; ++c) EXPECT_EQ(r->d_hidden.get(t * C + c), 0.0);
    }
    EXPECT_GT(r->nll.get(0), 0.0);
    for (std::int64_t c = 0; c < C; ++c) {
      hidden.set(1 * C + c, 5.0);
      hidden.set(3 * C + c, -5.0);
    }
    auto r2 = run_ce(*be, hidden, weight, targets, o);
    ASSERT_TRUE(r2.ok());
    EXPECT_EQ(testing::max_abs_diff(r2->d_weight, r->d_weight), 0.0) << be->name();

    const HostTensor all_ignored = testing::from_values({T}, DType::kI32, {7, 7, 7, 7});
    const HostTensor init = testing::random_tensor({V, C}, dt, 8);
    auto r3 = run_ce(*be, hidden, weight, all_ignored, o, &init);
    ASSERT_TRUE(r3.ok());
    EXPECT_EQ(testing::max_abs(r3->nll), 0.0);
    EXPECT_EQ(testing::max_abs(r3->d_hidden), 0.0);
    EXPECT_EQ(testing::max_abs_diff(r3->d_weight, init), 0.0) << be->name();
  }
}

TEST(CrossEntropy, WorkspaceSizeAndBadInputs) {
  const std::int64_t T = 5, C = 3, V = 9;
  for (Backend* be : {&reference_backend(), &cpu_backend()}) {
    const DType dt = be == &reference_backend() ? DType::kF64 : DType::kF32;
    const HostTensor hidden = testing::random_tensor({T, C}, dt, 1);
    const HostTensor weight = testing::random_tensor({V, C}, dt, 2);
    HostTensor targets = testing::from_values({T}, DType::kI32, {0, 8, -100, 4, 1});
    // workspace_bytes() is exactly enough: chunk 2 rows x V logits of the backend's dtype.
    CrossEntropyArgs probe;
    probe.hidden = hidden.cview();
    probe.weight = weight.cview();
    probe.chunk_tokens = 2;
    EXPECT_EQ(be->workspace_bytes(probe), 2u * V * dtype_size(dt)) << be->name();
    EXPECT_TRUE(run_ce(*be, hidden, weight, targets, {.chunk = 2}).ok());
    EXPECT_EQ(
        run_ce(*be, hidden, weight, targets, {.chunk = 2, .workspace_delta = -1}).status().code(),
        StatusCode::kInvalidArgument);
    EXPECT_EQ(run_ce(*be, hidden, weight, targets, {.chunk = 0}).status().code(),
              StatusCode::kInvalidArgument);
    targets.set(3, 9);  // == V
    EXPECT_EQ(run_ce(*be, hidden, weight, targets, {}).status().code(),
              StatusCode::kInvalidArgument);
    targets.set(3, -1);
    EXPECT_EQ(run_ce(*be, hidden, weight, targets, {}).status().code(),
              StatusCode::kInvalidArgument);
    targets.set(3, 4);
    const HostTensor wrong_c = testing::random_tensor({V, C + 1}, dt, 3);
    EXPECT_EQ(run_ce(*be, hidden, wrong_c, targets, {}).status().code(),
              StatusCode::kInvalidArgument);
  }
}

// Naive f32: float dot products, float max/sum/log, float gradient sums.
CeResult naive_f32(const HostTensor& h, const HostTensor& w, const HostTensor& tg, float scale) {
  const std::int64_t T = h.shape()[0], C = h.shape()[1], V = w.shape()[0];
  CeResult r{HostTensor({T}, DType::kF32), HostTensor({T, C}, DType::kF32),
             HostTensor({V, C}, DType::kF32)};
  std::vector<float> dw(V * C, 0.0f);
  for (std::int64_t t = 0; t < T; ++t) {
    const auto target = static_cast<std::int64_t>(tg.get(t));
    if (target < 0) continue;
    std::vector<float> l(V);
    float m = -INFINITY, s = 0.0f;
    for (std::int64_t v = 0; v < V; ++v) {
      float dot = 0.0f;
      for (std::int64_t c = 0; c < C; ++c) {
        dot += static_cast<float>(h.get(t * C + c)) * static_cast<float>(w.get(v * C + c));
      }
      l[v] = dot;
      m = std::max(m, dot);
    }
    for (std::int64_t v = 0; v < V; ++v) s += std::exp(l[v] - m);
    const float lse = m + std::log(s);
    r.nll.set(t, lse - l[target]);
    for (std::int64_t c = 0; c < C; ++c) {
      float dh = 0.0f;
      for (std::int64_t v = 0; v < V; ++v) {
        const float g = scale * (std::exp(l[v] - lse) - (v == target ? 1.0f : 0.0f));
        dh += g * static_cast<float>(w.get(v * C + c));
        dw[v * C + c] += g * static_cast<float>(h.get(t * C + c));
      }
      r.d_hidden.set(t * C + c, dh);
    }
  }
  for (std::int64_t i = 0; i < V * C; ++i) r.d_weight.set(i, dw[i]);
  return r;
}

TEST(CrossEntropyCpu, WithinTwiceNaiveF32Error) {
  struct Case {
    std::int64_t T, C, V;
    int chunk;
  };
  for (const Case c :
       {Case{1, 3, 5, 4}, Case{7, 16, 31, 3}, Case{13, 8, 50, 13}, Case{29, 32, 97, 8}}) {
    const auto seed = static_cast<std::uint64_t>(c.T * 1000 + c.V);
    const HostTensor h32 = testing::random_tensor({c.T, c.C}, DType::kF32, seed);
    const HostTensor w32 = testing::random_tensor({c.V, c.C}, DType::kF32, seed + 1);
    HostTensor tg = testing::random_ids(c.T, c.V, seed + 2);
    if (c.T > 2) tg.set(1, -100);
    const float scale = 1.0f / static_cast<float>(c.T);
    auto want =
        run_ce(reference_backend(), testing::converted(h32, DType::kF64),
               testing::converted(w32, DType::kF64), tg, {.chunk = c.chunk, .grad_scale = scale});
    auto got = run_ce(cpu_backend(), h32, w32, tg, {.chunk = c.chunk, .grad_scale = scale});
    ASSERT_TRUE(want.ok() && got.ok());
    const CeResult naive = naive_f32(h32, w32, tg, scale);
    // atol: 16 f32 unit roundoffs (~1e-6) at the O(1) scale of nll and logits; it matters only
    // where the naive loop happens to be exact.
    const double atol = 16.0 * testing::eps_of(DType::kF32);
    auto err = [](const HostTensor& a, const HostTensor& b) { return testing::max_abs_diff(a, b); };
    const std::string what = "T=" + std::to_string(c.T) + " V=" + std::to_string(c.V);
    EXPECT_LE(err(got->nll, want->nll), 2 * err(naive.nll, want->nll) + atol) << what;
    EXPECT_LE(err(got->d_hidden, want->d_hidden), 2 * err(naive.d_hidden, want->d_hidden) + atol)
        << what;
    EXPECT_LE(err(got->d_weight, want->d_weight), 2 * err(naive.d_weight, want->d_weight) + atol)
        << what;
  }
}

}  // namespace
}  // namespace ferry::kernels
