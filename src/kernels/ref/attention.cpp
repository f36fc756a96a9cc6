// SPDX-License-Identifier: Apache-2.0
// Reference causal grouped-query attention over packed variable-length sequences, forward and
// backward: the executable spec. Plain loops in f64, one query row at a time with its whole score
// row (no blocking, no online softmax), so each line maps onto the math:
//   s_ij = scale * q_i . k_j  (j <= i when causal, j in i's sequence),  lse_i = log sum_j e^s_ij,
//   out_i = sum_j p_ij v_j with p_ij = e^(s_ij - lse_i).
// The backward uses the saved out and lse (FlashAttention-2): D_i = dO_i . out_i,
//   dP_ij = dO_i . v_j,  dS_ij = p_ij (dP_ij - D_i),  dQ_i = scale sum_j dS_ij k_j,
//   dK_j = scale sum_i dS_ij q_i,  dV_j = sum_i p_ij dO_i.
// Scratch is host std::vectors: the reference is never on a steady-state path.
// Tested by tests/unit/kernels/attention_*test.cpp (finite differences, CPU comparison).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attn_moe_ce_checks.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {
namespace {

using detail::load;
using detail::store;

// Flat index of [t, head, d] in a [T, heads, D] tensor.
inline std::int64_t at(std::int64_t t, std::int64_t head, std::int64_t d, std::int64_t heads,
                       std::int64_t D) {
  return (t * heads + head) * D + d;
}

// Last key index (exclusive) that query i (absolute) may read in a sequence [b, e).
inline std::int64_t key_end(std::int64_t i, std::int64_t e, bool causal) {
  return causal ? i + 1 : e;
}

}  // namespace

Status ReferenceBackend::attention(const AttentionArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::AttentionDims dm,
                         detail::check_attention(a, detail::FloatSet::kRef));
  const std::int64_t H = dm.H, G = dm.G, D = dm.D, T = dm.T;
  const std::int64_t group = H / G;
  const auto* cu = a.cu_seqlens.as<std::int32_t>();
  std::vector<double> s(static_cast<std::size_t>(T));
  std::vector<double> acc(static_cast<std::size_t>(D));
  for (std::int64_t seq = 0; seq < dm.S; ++seq) {
    const std::int64_t b = cu[seq], e = cu[seq + 1];
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t i = b; i < e; ++i) {
        const std::int64_t je = key_end(i, e, a.causal);
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = b; j < je; ++j) {
          double dot = 0.0;
          for (std::int64_t d = 0; d < D; ++d) {
            dot += load(a.q, at(i, h, d, H, D)) * load(a.k, at(j, g, d, G, D));
          }
          s[j - b] = dm.scale * dot;
          m = std::max(m, s[j - b]);
        }
        double l = 0.0;
        for (std::int64_t j = b; j < je; ++j) l += std::exp(s[j - b] - m);
        const double lse = m + std::log(l);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (std::int64_t j = b; j < je; ++j) {
          const double p = std::exp(s[j - b] - lse);
          for (std::int64_t d = 0; d < D; ++d) acc[d] += p * load(a.v, at(j, g, d, G, D));
        }
        for (std::int64_t d = 0; d < D; ++d) store(a.out, at(i, h, d, H, D), acc[d]);
        if (!a.lse.empty_view()) store(a.lse, h * T + i, lse);
      }
    }
  }
  return ok_status();
}

Status ReferenceBackend::attention_backward(const AttentionBackwardArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::AttentionDims dm,
                         detail::check_attention_backward(a, detail::FloatSet::kRef));
  const std::int64_t H = dm.H, G = dm.G, D = dm.D, T = dm.T;
  const std::int64_t group = H / G;
  const auto* cu = a.cu_seqlens.as<std::int32_t>();
  std::vector<double> dq(static_cast<std::size_t>(T * H * D), 0.0);
  std::vector<double> dk(static_cast<std::size_t>(T * G * D), 0.0);
  std::vector<double> dv(static_cast<std::size_t>(T * G * D), 0.0);
  for (std::int64_t seq = 0; seq < dm.S; ++seq) {
    const std::int64_t b = cu[seq], e = cu[seq + 1];
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t i = b; i < e; ++i) {
        double Di = 0.0;
        for (std::int64_t d = 0; d < D; ++d) {
          Di += load(a.d_out, at(i, h, d, H, D)) * load(a.out, at(i, h, d, H, D));
        }
        const double lse = load(a.lse, h * T + i);
        for (std::int64_t j = b; j < key_end(i, e, a.causal); ++j) {
          double qk = 0.0, dp = 0.0;
          for (std::int64_t d = 0; d < D; ++d) {
            qk += load(a.q, at(i, h, d, H, D)) * load(a.k, at(j, g, d, G, D));
            dp += load(a.d_out, at(i, h, d, H, D)) * load(a.v, at(j, g, d, G, D));
          }
          const double p = std::exp(dm.scale * qk - lse);
          const double ds = p * (dp - Di);
          for (std::int64_t d = 0; d < D; ++d) {
            dq[at(i, h, d, H, D)] += dm.scale * ds * load(a.k, at(j, g, d, G, D));
            dk[at(j, g, d, G, D)] += dm.scale * ds * load(a.q, at(i, h, d, H, D));
            dv[at(j, g, d, G, D)] += p * load(a.d_out, at(i, h, d, H, D));
          }
        }
      }
    }
  }
  for (std::size_t i = 0; i < dq.size(); ++i) store(a.d_q, static_cast<std::int64_t>(i), dq[i]);
  for (std::size_t i = 0; i < dk.size(); ++i) {
    store(a.d_k, static_cast<std::int64_t>(i), dk[i]);
    store(a.d_v, static_cast<std::int64_t>(i), dv[i]);
  }
  return ok_status();
}

}  // namespace ferry::kernels
