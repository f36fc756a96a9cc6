// SPDX-License-Identifier: Apache-2.0
// CPU fused lm_head + cross-entropy, chunked over tokens so only [chunk, V] f32 logits exist
// (in args.workspace; workspace_bytes = chunk * V * 4). Per chunk:
//   logits = hidden_chunk @ weight^T                (cblas_sgemm, OpenBLAS threads)
//   per row, threaded: lse (f64 sum of exponentials), nll = lse - logit[target], and when
//     gradients are wanted the row becomes dlogit = grad_scale * (softmax - onehot) in place
//     (zero for ignored rows)
//   d_hidden_chunk = dlogit @ weight                (sgemm, overwrite)
//   d_weight += dlogit^T @ hidden_chunk             (sgemm, beta = 1: accumulates)
// The row softmax uses our ThreadPool and the GEMMs OpenBLAS's own threads, never at the same
// time. Matches ref/cross_entropy.cpp (tests/unit/kernels/cross_entropy_*test.cpp).
#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "kernels/attn_moe_ce_checks.h"
#include "kernels/cpu/cpu_backend.h"

namespace ferry::kernels {

std::size_t CpuBackend::workspace_bytes(const CrossEntropyArgs& a) const {
  if (a.weight.ndim != 2) return 0;
  return static_cast<std::size_t>(detail::cross_entropy_chunk_rows(a) * a.weight.shape[0]) *
         sizeof(float);
}

Status CpuBackend::cross_entropy(const CrossEntropyArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::CrossEntropyDims dm,
                         detail::check_cross_entropy(a, detail::FloatSet::kF32, sizeof(float)));
  const std::int64_t T = dm.T, C = dm.C, V = dm.V;
  const auto* targets = a.targets.as<std::int32_t>();
  const auto* hidden = a.hidden.as<float>();
  const auto* weight = a.weight.as<float>();
  float* nll = a.nll.as<float>();
  float* logits = a.workspace.as<float>();  // [chunk, V]
  float* d_hidden = a.d_hidden.empty_view() ? nullptr : a.d_hidden.as<float>();
  float* d_weight = a.d_weight.empty_view() ? nullptr : a.d_weight.as<float>();
  const bool want_grad = d_hidden != nullptr || d_weight != nullptr;
  const float grad_scale = a.grad_scale;
  const auto iC = static_cast<int>(C), iV = static_cast<int>(V);

  for (std::int64_t t0 = 0; t0 < T; t0 += dm.chunk) {
    const std::int64_t rows = std::min(dm.chunk, T - t0);
    const auto irows = static_cast<int>(rows);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, irows, iV, iC, 1.0f, hidden + t0 * C, iC,
                weight, iC, 0.0f, logits, iV);
    ThreadPool::global().parallel_for(
        static_cast<std::size_t>(rows), [&](std::size_t rb, std::size_t re) {
          for (auto r = static_cast<std::int64_t>(rb); r < static_cast<std::int64_t>(re); ++r) {
            const std::int64_t t = t0 + r;
            float* row = logits + r * V;
            const std::int32_t target = targets[t];
            if (target == a.ignore_index) {
              nll[t] = 0.0f;
              if (want_grad) std::fill(row, row + V, 0.0f);
              continue;
            }
            float m = row[0];
            for (std::int64_t v = 1; v < V; ++v) m = std::max(m, row[v]);
            double sum = 0.0;
            for (std::int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - m);
            const float lse = m + static_cast<float>(std::log(sum));
            nll[t] = lse - row[target];
            if (!want_grad) continue;
            for (std::int64_t v = 0; v < V; ++v) row[v] = std::exp(row[v] - lse);
            row[target] -= 1.0f;
            for (std::int64_t v = 0; v < V; ++v) row[v] *= grad_scale;
          }
        });
    if (d_hidden != nullptr) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, irows, iC, iV, 1.0f, logits, iV,
                  weight, iC, 0.0f, d_hidden + t0 * C, iC);
    }
    if (d_weight != nullptr) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, iV, iC, irows, 1.0f, logits, iV,
                  hidden + t0 * C, iC, 1.0f, d_weight, iC);
    }
  }
  return ok_status();
}

}  // namespace ferry::kernels
