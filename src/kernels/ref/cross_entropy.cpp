// SPDX-License-Identifier: Apache-2.0
// Reference fused lm_head + cross-entropy: for each chunk of at most chunk_tokens rows, the f64
// logits hidden[t] . weight[v] go into args.workspace ([chunk, V] f64, so workspace_bytes is
// chunk * V * 8), then per row lse, nll = lse - logit[target], and for the gradients of
// L = sum_t grad_scale * nll[t]:  dlogit[t, v] = grad_scale * (softmax[t, v] - [v == target]),
//   d_hidden[t] = sum_v dlogit[t, v] weight[v]   (overwritten),
//   d_weight[v] += sum_{t in chunk} dlogit[t, v] hidden[t]   (f64 sum per chunk, then added).
// Ignored rows (target == ignore_index) have nll 0 and zero gradient.
// Tested by tests/unit/kernels/cross_entropy_*test.cpp.
#include <algorithm>
#include <cmath>

#include "kernels/attn_moe_ce_checks.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {

using detail::load;
using detail::store;

std::size_t ReferenceBackend::workspace_bytes(const CrossEntropyArgs& a) const {
  if (a.weight.ndim != 2) return 0;
  return static_cast<std::size_t>(detail::cross_entropy_chunk_rows(a) * a.weight.shape[0]) *
         sizeof(double);
}

Status ReferenceBackend::cross_entropy(const CrossEntropyArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::CrossEntropyDims dm,
                         detail::check_cross_entropy(a, detail::FloatSet::kRef, sizeof(double)));
  const std::int64_t T = dm.T, C = dm.C, V = dm.V;
  const auto* targets = a.targets.as<std::int32_t>();
  auto* logits = a.workspace.as<double>();  // [chunk, V]
  const bool want_grad = !a.d_hidden.empty_view() || !a.d_weight.empty_view();
  for (std::int64_t t0 = 0; t0 < T; t0 += dm.chunk) {
    const std::int64_t rows = std::min(dm.chunk, T - t0);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t v = 0; v < V; ++v) {
        double dot = 0.0;
        for (std::int64_t c = 0; c < C; ++c) {
          dot += load(a.hidden, (t0 + r) * C + c) * load(a.weight, v * C + c);
        }
        logits[r * V + v] = dot;
      }
    }
    // Per row: nll, then (when gradients are wanted) the row becomes dlogit in place.
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t t = t0 + r;
      double* row = logits + r * V;
      if (targets[t] == a.ignore_index) {
        store(a.nll, t, 0.0);
        std::fill(row, row + V, 0.0);
        continue;
      }
      double m = -INFINITY;
      for (std::int64_t v = 0; v < V; ++v) m = std::max(m, row[v]);
      double sum = 0.0;
      for (std::int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - m);
      const double lse = m + std::log(sum);
      store(a.nll, t, lse - row[targets[t]]);
      for (std::int64_t v = 0; v < V; ++v) {
        row[v] = a.grad_scale * (std::exp(row[v] - lse) - (v == targets[t] ? 1.0 : 0.0));
      }
    }
    if (!want_grad) continue;
    if (!a.d_hidden.empty_view()) {
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = 0; c < C; ++c) {
          double sum = 0.0;
          for (std::int64_t v = 0; v < V; ++v) sum += logits[r * V + v] * load(a.weight, v * C + c);
          store(a.d_hidden, (t0 + r) * C + c, sum);
        }
      }
    }
    if (!a.d_weight.empty_view()) {
      for (std::int64_t v = 0; v < V; ++v) {
        for (std::int64_t c = 0; c < C; ++c) {
          double sum = 0.0;
          for (std::int64_t r = 0; r < rows; ++r) {
            sum += logits[r * V + v] * load(a.hidden, (t0 + r) * C + c);
          }
          store(a.d_weight, v * C + c, load(a.d_weight, v * C + c) + sum);
        }
      }
    }
  }
  return ok_status();
}

}  // namespace ferry::kernels
