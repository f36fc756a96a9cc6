// SPDX-License-Identifier: Apache-2.0
// CPU MoE ops: router (+ backward), dispatch (+ backward), combine (+ backward). f32, threaded
// over tokens with ThreadPool::global(); no allocation.
//   router: softmax per row (f64 sum), then top-k by repeated selection below the previous pick in
//           the order (logit desc, id asc), which needs no "already chosen" scratch.
//   dispatch: a counting sort over expert ids (stable by token, then k, as ops.h requires), run
//           in expert_offsets itself (starts -> cursors -> shifted back), then threaded row copies.
//   combine: out[t] = fma(w[t,K-1], row, ... fma(w[t,0], row, +0)) in f32, k ascending. The
//           fused multiply-add chain is the definition (see MoeCombineArgs in ops.h) so CPU and
//           CUDA give the same bytes; the AVX2+FMA body and the std::fma scalar body are
//           bit-identical because fma rounds once either way.
// Tested against ref/moe.cpp by tests/unit/kernels/router_*test.cpp and moe_*test.cpp.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "kernels/attn_moe_ce_checks.h"
#include "kernels/cpu/cpu_backend.h"

namespace ferry::kernels {
namespace {

constexpr std::size_t kMinTokensPerTask = 16;

void parallel_tokens(std::int64_t T, const std::function<void(std::int64_t)>& body) {
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(T),
      [&](std::size_t b, std::size_t e) {
        for (std::size_t t = b; t < e; ++t) body(static_cast<std::int64_t>(t));
      },
      kMinTokensPerTask);
}

// One row of the combine: out[c] = fma chain over k. Scalar body and tail.
void combine_row_scalar(float* out, const float* const* rows, const float* w, std::int64_t K,
                        std::int64_t c0, std::int64_t C) {
  for (std::int64_t c = c0; c < C; ++c) {
    float acc = 0.0f;
    for (std::int64_t k = 0; k < K; ++k) acc = std::fma(w[k], rows[k][c], acc);
    out[c] = acc;
  }
}

__attribute__((target("avx2,fma"))) void combine_row_avx2(float* out, const float* const* rows,
                                                          const float* w, std::int64_t K,
                                                          std::int64_t C) {
  const std::int64_t body = C / 8 * 8;
  for (std::int64_t c = 0; c < body; c += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (std::int64_t k = 0; k < K; ++k) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(w[k]), _mm256_loadu_ps(rows[k] + c), acc);
    }
    _mm256_storeu_ps(out + c, acc);
  }
  combine_row_scalar(out, rows, w, K, body, C);
}

bool has_avx2_fma() {
  static const bool kHas = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return kHas;
}

// Largest K the combine keeps row pointers for on the stack.
constexpr std::int64_t kMaxTopK = 64;

}  // namespace

Status CpuBackend::router(const RouterArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::RouterDims dm,
                         detail::check_router(a, detail::FloatSet::kF32));
  const std::int64_t E = dm.E, K = dm.K;
  parallel_tokens(dm.T, [&](std::int64_t t) {
    const float* logit = a.logits.as<float>() + t * E;
    float* probs = a.probs.as<float>() + t * E;
    float* weights = a.weights.as<float>() + t * K;
    std::int32_t* ids = a.ids.as<std::int32_t>() + t * K;
    float m = -INFINITY;
    for (std::int64_t e = 0; e < E; ++e) m = std::max(m, logit[e]);
    double sum = 0.0;
    for (std::int64_t e = 0; e < E; ++e) sum += std::exp(logit[e] - m);
    const float inv_sum = static_cast<float>(1.0 / sum);
    for (std::int64_t e = 0; e < E; ++e) probs[e] = std::exp(logit[e] - m) * inv_sum;
    // k-th pick: the best (logit desc, id asc) strictly after the (k-1)-th pick in that order.
    float picked_sum = 0.0f;
    for (std::int64_t k = 0; k < K; ++k) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < E; ++e) {
        if (k > 0) {
          const float prev = logit[ids[k - 1]];
          const bool after_prev = logit[e] < prev || (logit[e] == prev && e > ids[k - 1]);
          if (!after_prev) continue;
        }
        if (best < 0 || logit[e] > logit[best]) best = e;
      }
      ids[k] = static_cast<std::int32_t>(best);
      weights[k] = probs[best];
      picked_sum += probs[best];
    }
    if (a.renormalize) {
      for (std::int64_t k = 0; k < K; ++k) weights[k] /= picked_sum;
    }
  });
  return ok_status();
}

Status CpuBackend::router_backward(const RouterBackwardArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::RouterDims dm,
                         detail::check_router_backward(a, detail::FloatSet::kF32));
  const std::int64_t E = dm.E, K = dm.K;
  parallel_tokens(dm.T, [&](std::int64_t t) {
    const float* p = a.probs.as<float>() + t * E;
    const float* dw = a.d_weights.as<float>() + t * K;
    const std::int32_t* ids = a.ids.as<std::int32_t>() + t * K;
    float* d_logits = a.d_logits.as<float>() + t * E;
    float S = 0.0f, dw_dot_w = 0.0f;
    for (std::int64_t k = 0; k < K; ++k) S += p[ids[k]];
    for (std::int64_t k = 0; k < K; ++k) dw_dot_w += dw[k] * (p[ids[k]] / S);
    // dp is zero off the chosen ids; p . dp only has the K chosen terms.
    auto dp_of = [&](std::int64_t k) { return a.renormalize ? (dw[k] - dw_dot_w) / S : dw[k]; };
    float p_dot_dp = 0.0f;
    for (std::int64_t k = 0; k < K; ++k) p_dot_dp += p[ids[k]] * dp_of(k);
    for (std::int64_t e = 0; e < E; ++e) d_logits[e] = p[e] * (0.0f - p_dot_dp);
    for (std::int64_t k = 0; k < K; ++k) d_logits[ids[k]] = p[ids[k]] * (dp_of(k) - p_dot_dp);
  });
  return ok_status();
}

Status CpuBackend::moe_dispatch(const MoeDispatchArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::MoeDims dm,
                         detail::check_moe_dispatch(a, detail::FloatSet::kF32));
  const std::int64_t T = dm.T, K = dm.K, C = dm.C, E = dm.E;
  const auto* ids = a.ids.as<std::int32_t>();
  auto* offsets = a.expert_offsets.as<std::int32_t>();
  auto* slot_of = a.slot_of.as<std::int32_t>();
  // Counting sort: counts -> start offsets -> cursors (offsets[e] ends as the end of e).
  std::fill(offsets, offsets + E + 1, 0);
  for (std::int64_t i = 0; i < T * K; ++i) ++offsets[ids[i]];
  std::int32_t start = 0;
  for (std::int64_t e = 0; e < E; ++e) {
    const std::int32_t count = offsets[e];
    offsets[e] = start;
    start += count;
  }
  for (std::int64_t i = 0; i < T * K; ++i) slot_of[i] = offsets[ids[i]]++;
  for (std::int64_t e = E; e > 0; --e) offsets[e] = offsets[e - 1];  // ends -> starts
  offsets[0] = 0;
  const float* x = a.x.as<float>();
  float* gathered = a.gathered.as<float>();
  parallel_tokens(T, [&](std::int64_t t) {
    for (std::int64_t k = 0; k < K; ++k) {
      std::memcpy(gathered + slot_of[t * K + k] * C, x + t * C, sizeof(float) * C);
    }
  });
  return ok_status();
}

Status CpuBackend::moe_dispatch_backward(const MoeDispatchBackwardArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::MoeDims dm,
                         detail::check_moe_dispatch_backward(a, detail::FloatSet::kF32));
  const std::int64_t K = dm.K, C = dm.C;
  const auto* slot_of = a.slot_of.as<std::int32_t>();
  const float* dg = a.d_gathered.as<float>();
  float* d_x = a.d_x.as<float>();
  parallel_tokens(dm.T, [&](std::int64_t t) {
    float* row = d_x + t * C;
    for (std::int64_t k = 0; k < K; ++k) {
      const float* src = dg + slot_of[t * K + k] * C;
      for (std::int64_t c = 0; c < C; ++c) row[c] += src[c];
    }
  });
  return ok_status();
}

Status CpuBackend::moe_combine(const MoeCombineArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::MoeDims dm,
                         detail::check_moe_combine(a, detail::FloatSet::kF32));
  const std::int64_t K = dm.K, C = dm.C;
  if (K > kMaxTopK) {
    return unimplemented("kernels: moe_combine: cpu backend supports top-k <= {}, got {}", kMaxTopK,
                         K);
  }
  const auto* slot_of = a.slot_of.as<std::int32_t>();
  const float* expert_out = a.expert_out.as<float>();
  const bool simd = has_avx2_fma();
  parallel_tokens(dm.T, [&](std::int64_t t) {
    const float* rows[kMaxTopK];
    for (std::int64_t k = 0; k < K; ++k) rows[k] = expert_out + slot_of[t * K + k] * C;
    float* out = a.out.as<float>() + t * C;
    const float* w = a.weights.as<float>() + t * K;
    if (simd) {
      combine_row_avx2(out, rows, w, K, C);
    } else {
      combine_row_scalar(out, rows, w, K, 0, C);
    }
  });
  return ok_status();
}

Status CpuBackend::moe_combine_backward(const MoeCombineBackwardArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::MoeDims dm,
                         detail::check_moe_combine_backward(a, detail::FloatSet::kF32));
  const std::int64_t K = dm.K, C = dm.C;
  const auto* slot_of = a.slot_of.as<std::int32_t>();
  const float* expert_out = a.expert_out.as<float>();
  const float* d_out = a.d_out.as<float>();
  // Each (t, k) owns row slot_of[t, k] when slot_of is a permutation (what dispatch writes);
  // rows are overwritten, so a repeated slot keeps only its last writer (documented in ops.h).
  parallel_tokens(dm.T, [&](std::int64_t t) {
    const float* g = d_out + t * C;
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int64_t r = slot_of[t * K + k];
      const float w = a.weights.as<float>()[t * K + k];
      float* dst = a.d_expert_out.as<float>() + r * C;
      const float* src = expert_out + r * C;
      float dw = 0.0f;
      for (std::int64_t c = 0; c < C; ++c) {
        dst[c] = w * g[c];
        dw += g[c] * src[c];
      }
      a.d_weights.as<float>()[t * K + k] = dw;
    }
  });
  return ok_status();
}

}  // namespace ferry::kernels
