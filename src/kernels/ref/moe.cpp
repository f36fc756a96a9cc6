// SPDX-License-Identifier: Apache-2.0
// Reference MoE ops: router (softmax + top-k + optional renormalisation) and its backward, token
// dispatch (sort assignments by expert) and combine (weighted sum in routing order), with their
// backwards. f64 arithmetic, one token at a time; written to be read against ops.h.
//   router backward, with p = probs, I = the K chosen ids, S = sum_{k} p_{I_k}, w_k = p_{I_k}/S:
//     renormalize:  dL/dp_{I_k} = (dw_k - sum_m dw_m w_m) / S;  otherwise dL/dp_{I_k} = dw_k;
//     softmax:      dL/dlogit_e = p_e (dL/dp_e - sum_j p_j dL/dp_j).
// Dispatch is written as "for each expert, scan tokens then k in order", which is the stable sort
// of ops.h by construction (the CPU backend uses a counting sort and must agree exactly).
// Tested by tests/unit/kernels/router_*test.cpp and moe_*test.cpp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attn_moe_ce_checks.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {

using detail::load;
using detail::store;

Status ReferenceBackend::router(const RouterArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::RouterDims dm,
                         detail::check_router(a, detail::FloatSet::kRef));
  const std::int64_t E = dm.E, K = dm.K;
  std::vector<double> logit(static_cast<std::size_t>(E));
  std::vector<bool> chosen(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < dm.T; ++t) {
    double m = -INFINITY;
    for (std::int64_t e = 0; e < E; ++e) {
      logit[e] = load(a.logits, t * E + e);  // finite or -inf (checked)
      m = std::max(m, logit[e]);
    }
    double sum = 0.0;
    for (std::int64_t e = 0; e < E; ++e) sum += std::exp(logit[e] - m);
    for (std::int64_t e = 0; e < E; ++e) store(a.probs, t * E + e, std::exp(logit[e] - m) / sum);
    // Top-k: repeatedly take the largest remaining logit; '>' keeps the lower id on ties. Ranking
    // logits is ranking probabilities (softmax is monotone).
    std::fill(chosen.begin(), chosen.end(), false);
    double picked_sum = 0.0;
    for (std::int64_t k = 0; k < K; ++k) {
      std::int64_t best = -1;
      for (std::int64_t e = 0; e < E; ++e) {
        if (!chosen[e] && (best < 0 || logit[e] > logit[best])) best = e;
      }
      chosen[best] = true;
      a.ids.as<std::int32_t>()[t * K + k] = static_cast<std::int32_t>(best);
      picked_sum += std::exp(logit[best] - m) / sum;
    }
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int32_t e = a.ids.as<std::int32_t>()[t * K + k];
      const double p = std::exp(logit[e] - m) / sum;
      store(a.weights, t * K + k, a.renormalize ? p / picked_sum : p);
    }
  }
  return ok_status();
}

Status ReferenceBackend::router_backward(const RouterBackwardArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::RouterDims dm,
                         detail::check_router_backward(a, detail::FloatSet::kRef));
  const std::int64_t E = dm.E, K = dm.K;
  std::vector<double> dp(static_cast<std::size_t>(E));
  for (std::int64_t t = 0; t < dm.T; ++t) {
    const auto* ids = a.ids.as<std::int32_t>() + t * K;
    std::fill(dp.begin(), dp.end(), 0.0);
    double S = 0.0;
    for (std::int64_t k = 0; k < K; ++k) S += load(a.probs, t * E + ids[k]);
    double dw_dot_w = 0.0;
    for (std::int64_t k = 0; k < K; ++k) {
      dw_dot_w += load(a.d_weights, t * K + k) * load(a.probs, t * E + ids[k]) / S;
    }
    for (std::int64_t k = 0; k < K; ++k) {
      const double dw = load(a.d_weights, t * K + k);
      dp[ids[k]] = a.renormalize ? (dw - dw_dot_w) / S : dw;
    }
    double p_dot_dp = 0.0;
    for (std::int64_t e = 0; e < E; ++e) p_dot_dp += load(a.probs, t * E + e) * dp[e];
    for (std::int64_t e = 0; e < E; ++e) {
      const double p = load(a.probs, t * E + e);
      store(a.d_logits, t * E + e, p * (dp[e] - p_dot_dp));
    }
  }
  return ok_status();
}

Status ReferenceBackend::moe_dispatch(const MoeDispatchArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::MoeDims dm,
                         detail::check_moe_dispatch(a, detail::FloatSet::kRef));
  const std::int64_t T = dm.T, K = dm.K, C = dm.C;
  const auto* ids = a.ids.as<std::int32_t>();
  auto* offsets = a.expert_offsets.as<std::int32_t>();
  auto* slot_of = a.slot_of.as<std::int32_t>();
  std::int64_t row = 0;
  for (std::int64_t e = 0; e < dm.E; ++e) {
    offsets[e] = static_cast<std::int32_t>(row);
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t k = 0; k < K; ++k) {
        if (ids[t * K + k] != e) continue;
        slot_of[t * K + k] = static_cast<std::int32_t>(row);
        for (std::int64_t c = 0; c < C; ++c) store(a.gathered, row * C + c, load(a.x, t * C + c));
        ++row;
      }
    }
  }
  offsets[dm.E] = static_cast<std::int32_t>(row);
  return ok_status();
}

Status ReferenceBackend::moe_dispatch_backward(const MoeDispatchBackwardArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::MoeDims dm,
                         detail::check_moe_dispatch_backward(a, detail::FloatSet::kRef));
  const std::int64_t K = dm.K, C = dm.C;
  const auto* slot_of = a.slot_of.as<std::int32_t>();
  for (std::int64_t t = 0; t < dm.T; ++t) {
    for (std::int64_t c = 0; c < C; ++c) {
      double sum = load(a.d_x, t * C + c);
      for (std::int64_t k = 0; k < K; ++k) sum += load(a.d_gathered, slot_of[t * K + k] * C + c);
      store(a.d_x, t * C + c, sum);
    }
  }
  return ok_status();
}

Status ReferenceBackend::moe_combine(const MoeCombineArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::MoeDims dm,
                         detail::check_moe_combine(a, detail::FloatSet::kRef));
  const std::int64_t K = dm.K, C = dm.C;
  const auto* slot_of = a.slot_of.as<std::int32_t>();
  for (std::int64_t t = 0; t < dm.T; ++t) {
    for (std::int64_t c = 0; c < C; ++c) {
      double sum = 0.0;
      for (std::int64_t k = 0; k < K; ++k) {
        sum += load(a.weights, t * K + k) * load(a.expert_out, slot_of[t * K + k] * C + c);
      }
      store(a.out, t * C + c, sum);
    }
  }
  return ok_status();
}

Status ReferenceBackend::moe_combine_backward(const MoeCombineBackwardArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::MoeDims dm,
                         detail::check_moe_combine_backward(a, detail::FloatSet::kRef));
  const std::int64_t T = dm.T, K = dm.K, C = dm.C;
  const auto* slot_of = a.slot_of.as<std::int32_t>();
  // Sum per row so a (malformed) slot_of that repeats a row still gets the true gradient.
  std::vector<double> d_rows(static_cast<std::size_t>(T * K * C), 0.0);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int64_t r = slot_of[t * K + k];
      const double w = load(a.weights, t * K + k);
      double dw = 0.0;
      for (std::int64_t c = 0; c < C; ++c) {
        const double g = load(a.d_out, t * C + c);
        d_rows[r * C + c] += w * g;
        dw += g * load(a.expert_out, r * C + c);
      }
      store(a.d_weights, t * K + k, dw);
    }
  }
  for (std::size_t i = 0; i < d_rows.size(); ++i) {
    store(a.d_expert_out, static_cast<std::int64_t>(i), d_rows[i]);
  }
  return ok_status();
}

}  // namespace ferry::kernels
