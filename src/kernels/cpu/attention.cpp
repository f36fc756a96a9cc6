// SPDX-License-Identifier: Apache-2.0
// CPU causal grouped-query attention over packed variable-length sequences, FlashAttention style:
// no T x T matrix ever exists. Forward: each work item is (sequence, query block of kQueryBlock
// rows, query head); it streams the sequence's keys in blocks of kKeyBlock and keeps an online
// softmax per query row (running max m, running sum l, unnormalised accumulator), then writes
// out = acc / l and lse = m + log l. Backward (FlashAttention-2 math with the saved out and lse,
// P recomputed block by block as exp(s - lse)) runs in two race-free passes:
//   pass 1, items (sequence, key block, kv head): dK, dV of those rows, summed over the group's
//           query heads and all later queries; each item owns its rows, so no atomics.
//   pass 2, items (sequence, query block, query head): dQ of those rows.
// The price of the split is recomputing s and dP twice; the gain is parallelism over key blocks
// without per-thread partial dK/dV buffers. Items are handed out by an atomic counter (causal
// items differ in cost), to ThreadPool::global() workers. f32 throughout, D <= kMaxHeadDim.
// Matches ref/attention.cpp within the FlashAttention tolerance rule
// (tests/unit/kernels/attention_cpu_test.cpp).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "core/thread_pool.h"
#include "kernels/attn_moe_ce_checks.h"
#include "kernels/cpu/cpu_backend.h"

namespace ferry::kernels {
namespace {

constexpr std::int64_t kQueryBlock = 32;
constexpr std::int64_t kKeyBlock = 64;
constexpr std::int64_t kMaxHeadDim = 256;  // per-item scratch lives on the worker's stack

inline float dot(const float* a, const float* b, std::int64_t n) {
  float s = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
inline void axpy(float alpha, const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Work items are enumerated sequence by sequence; within a sequence, block by block, and within a
// block, head by head (adjacent heads of one kv group read the same keys back to back).
class ItemCursor {
 public:
  ItemCursor(const std::int32_t* cu, std::int64_t block, std::int64_t heads)
      : cu_(cu), block_(block), heads_(heads) {}
  std::int64_t items_in(std::int64_t seq) const {
    const std::int64_t len = cu_[seq + 1] - cu_[seq];
    return (len + block_ - 1) / block_ * heads_;
  }
  // Items are requested in increasing order per thread, so the cursor only moves forward.
  void seek(std::int64_t item, std::int64_t* seq, std::int64_t* blk, std::int64_t* head) {
    while (item >= base_ + items_in(seq_)) base_ += items_in(seq_++);
    const std::int64_t local = item - base_;
    *seq = seq_;
    *blk = local / heads_;
    *head = local % heads_;
  }

 private:
  const std::int32_t* cu_;
  std::int64_t block_, heads_;
  std::int64_t seq_ = 0, base_ = 0;
};

// Runs body(seq, block, head) for every item, dynamically balanced over the global pool.
template <typename Body>
void for_each_item(const std::int32_t* cu, std::int64_t S, std::int64_t block, std::int64_t heads,
                   const Body& body) {
  std::int64_t total = 0;
  for (std::int64_t s = 0; s < S; ++s) total += ItemCursor(cu, block, heads).items_in(s);
  if (total == 0) return;
  std::atomic<std::int64_t> next{0};
  ThreadPool& pool = ThreadPool::global();
  const auto parts = static_cast<std::size_t>(
      std::min<std::int64_t>(total, static_cast<std::int64_t>(pool.size()) + 1));
  pool.parallel_for(parts, [&](std::size_t, std::size_t) {
    ItemCursor cursor(cu, block, heads);
    for (;;) {
      const std::int64_t item = next.fetch_add(1, std::memory_order_relaxed);
      if (item >= total) return;
      std::int64_t seq = 0, blk = 0, head = 0;
      cursor.seek(item, &seq, &blk, &head);
      body(seq, blk, head);
    }
  });
}

struct Geometry {
  std::int64_t T, H, G, D, group;
  float scale;
  bool causal;
  const float* row(const float* base, std::int64_t t, std::int64_t head, std::int64_t heads) const {
    return base + (t * heads + head) * D;
  }
};

Status check_head_dim(std::int64_t D, const char* op) {
  if (D > kMaxHeadDim) {
    return unimplemented("kernels: {}: cpu backend supports head dim <= {}, got {}", op,
                         kMaxHeadDim, D);
  }
  return ok_status();
}

}  // namespace

Status CpuBackend::attention(const AttentionArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::AttentionDims dm,
                         detail::check_attention(a, detail::FloatSet::kF32));
  FERRY_TRY(check_head_dim(dm.D, "attention"));
  const Geometry geo{dm.T, dm.H, dm.G, dm.D, dm.H / dm.G, static_cast<float>(dm.scale), a.causal};
  const auto* cu = a.cu_seqlens.as<std::int32_t>();
  const auto* q = a.q.as<float>();
  const auto* k = a.k.as<float>();
  const auto* v = a.v.as<float>();
  auto* out = a.out.as<float>();
  float* lse = a.lse.empty_view() ? nullptr : a.lse.as<float>();
  const std::int64_t D = geo.D;

  for_each_item(
      cu, dm.S, kQueryBlock, geo.H, [&](std::int64_t seq, std::int64_t qb, std::int64_t h) {
        const std::int64_t b = cu[seq], e = cu[seq + 1];
        const std::int64_t i0 = b + qb * kQueryBlock, i1 = std::min(i0 + kQueryBlock, e);
        const std::int64_t g = h / geo.group;
        float qs[kQueryBlock * kMaxHeadDim];   // scaled queries
        float acc[kQueryBlock * kMaxHeadDim];  // unnormalised output rows
        float m[kQueryBlock], l[kQueryBlock], s[kKeyBlock];
        for (std::int64_t r = 0; r < i1 - i0; ++r) {
          const float* qi = geo.row(q, i0 + r, h, geo.H);
          for (std::int64_t d = 0; d < D; ++d) qs[r * D + d] = geo.scale * qi[d];
          std::fill(acc + r * D, acc + (r + 1) * D, 0.0f);
          m[r] = -std::numeric_limits<float>::infinity();
          l[r] = 0.0f;
        }
        const std::int64_t key_end = geo.causal ? i1 : e;
        for (std::int64_t j0 = b; j0 < key_end; j0 += kKeyBlock) {
          const std::int64_t j1 = std::min(j0 + kKeyBlock, key_end);
          for (std::int64_t r = 0; r < i1 - i0; ++r) {
            const std::int64_t jmax = geo.causal ? std::min(j1, i0 + r + 1) : j1;
            if (jmax <= j0) continue;  // every key of this block is in this row's future
            float block_max = -std::numeric_limits<float>::infinity();
            for (std::int64_t j = j0; j < jmax; ++j) {
              s[j - j0] = dot(qs + r * D, geo.row(k, j, g, geo.G), D);
              block_max = std::max(block_max, s[j - j0]);
            }
            const float m_new = std::max(m[r], block_max);
            const float alpha = std::exp(m[r] - m_new);  // 0 on the first block (m = -inf)
            float* acc_r = acc + r * D;
            for (std::int64_t d = 0; d < D; ++d) acc_r[d] *= alpha;
            l[r] *= alpha;
            for (std::int64_t j = j0; j < jmax; ++j) {
              const float p = std::exp(s[j - j0] - m_new);
              l[r] += p;
              axpy(p, geo.row(v, j, g, geo.G), acc_r, D);
            }
            m[r] = m_new;
          }
        }
        for (std::int64_t r = 0; r < i1 - i0; ++r) {
          float* o = out + ((i0 + r) * geo.H + h) * D;
          const float inv_l = 1.0f / l[r];
          for (std::int64_t d = 0; d < D; ++d) o[d] = acc[r * D + d] * inv_l;
          if (lse != nullptr) lse[h * geo.T + i0 + r] = m[r] + std::log(l[r]);
        }
      });
  return ok_status();
}

Status CpuBackend::attention_backward(const AttentionBackwardArgs& a, Stream&) {
  FERRY_ASSIGN_OR_RETURN(const detail::AttentionDims dm,
                         detail::check_attention_backward(a, detail::FloatSet::kF32));
  FERRY_TRY(check_head_dim(dm.D, "attention_backward"));
  const Geometry geo{dm.T, dm.H, dm.G, dm.D, dm.H / dm.G, static_cast<float>(dm.scale), a.causal};
  const auto* cu = a.cu_seqlens.as<std::int32_t>();
  const auto* q = a.q.as<float>();
  const auto* k = a.k.as<float>();
  const auto* v = a.v.as<float>();
  const auto* out = a.out.as<float>();
  const auto* d_out = a.d_out.as<float>();
  const auto* lse = a.lse.as<float>();
  auto* d_q = a.d_q.as<float>();
  auto* d_k = a.d_k.as<float>();
  auto* d_v = a.d_v.as<float>();
  const std::int64_t D = geo.D;

  // Pass 1: dK, dV for (sequence, key block, kv head).
  for_each_item(cu, dm.S, kKeyBlock, geo.G, [&](std::int64_t seq, std::int64_t kb, std::int64_t g) {
    const std::int64_t b = cu[seq], e = cu[seq + 1];
    const std::int64_t j0 = b + kb * kKeyBlock, j1 = std::min(j0 + kKeyBlock, e);
    float dk[kKeyBlock * kMaxHeadDim];
    float dv[kKeyBlock * kMaxHeadDim];
    std::fill(dk, dk + (j1 - j0) * D, 0.0f);
    std::fill(dv, dv + (j1 - j0) * D, 0.0f);
    for (std::int64_t h = g * geo.group; h < (g + 1) * geo.group; ++h) {
      // Causal: queries before j0 see none of these keys.
      for (std::int64_t i = geo.causal ? j0 : b; i < e; ++i) {
        const std::int64_t jmax = geo.causal ? std::min(j1, i + 1) : j1;
        const float* qi = geo.row(q, i, h, geo.H);
        const float* doi = geo.row(d_out, i, h, geo.H);
        const float Di = dot(doi, geo.row(out, i, h, geo.H), D);
        const float lse_i = lse[h * geo.T + i];
        for (std::int64_t j = j0; j < jmax; ++j) {
          const float p = std::exp(geo.scale * dot(qi, geo.row(k, j, g, geo.G), D) - lse_i);
          const float dp = dot(doi, geo.row(v, j, g, geo.G), D);
          const float ds = p * (dp - Di);
          axpy(p, doi, dv + (j - j0) * D, D);
          axpy(geo.scale * ds, qi, dk + (j - j0) * D, D);
        }
      }
    }
    for (std::int64_t j = j0; j < j1; ++j) {
      std::copy(dk + (j - j0) * D, dk + (j - j0 + 1) * D, d_k + (j * geo.G + g) * D);
      std::copy(dv + (j - j0) * D, dv + (j - j0 + 1) * D, d_v + (j * geo.G + g) * D);
    }
  });

  // Pass 2: dQ for (sequence, query block, query head).
  for_each_item(cu, dm.S, kQueryBlock, geo.H,
                [&](std::int64_t seq, std::int64_t qb, std::int64_t h) {
                  const std::int64_t b = cu[seq], e = cu[seq + 1];
                  const std::int64_t i0 = b + qb * kQueryBlock, i1 = std::min(i0 + kQueryBlock, e);
                  const std::int64_t g = h / geo.group;
                  float dq[kMaxHeadDim];
                  for (std::int64_t i = i0; i < i1; ++i) {
                    const float* qi = geo.row(q, i, h, geo.H);
                    const float* doi = geo.row(d_out, i, h, geo.H);
                    const float Di = dot(doi, geo.row(out, i, h, geo.H), D);
                    const float lse_i = lse[h * geo.T + i];
                    std::fill(dq, dq + D, 0.0f);
                    for (std::int64_t j = b; j < (geo.causal ? i + 1 : e); ++j) {
                      const float* kj = geo.row(k, j, g, geo.G);
                      const float p = std::exp(geo.scale * dot(qi, kj, D) - lse_i);
                      const float ds = p * (dot(doi, geo.row(v, j, g, geo.G), D) - Di);
                      axpy(geo.scale * ds, kj, dq, D);
                    }
                    std::copy(dq, dq + D, d_q + (i * geo.H + h) * D);
                  }
                });
  return ok_status();
}

}  // namespace ferry::kernels
