// SPDX-License-Identifier: Apache-2.0
// Online softmax per (token, head): running max m, running sum l, unnormalised accumulator; keys
// read block by block through the sequence's table. Threaded over (token, head) items.
#include "serve/paged_attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/thread_pool.h"

namespace ferry::serve {
namespace {
constexpr int kMaxHeadDim = 512;
}

Status paged_attention(const KvCache& kv, const PagedAttentionArgs& a) {
  if (a.D > kMaxHeadDim) {
    return unimplemented("serve: paged attention supports head dim <= {}, got {}", kMaxHeadDim,
                         a.D);
  }
  if (a.G <= 0 || a.H % a.G != 0) {
    return invalid_argument("serve: {} heads not divisible by {} kv heads", a.H, a.G);
  }
  const std::int64_t items = a.T * a.H;
  const std::int64_t group = a.H / a.G;
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(items),
      [&](std::size_t b, std::size_t e) {
        float acc[kMaxHeadDim];
        for (std::size_t item = b; item < e; ++item) {
          const std::int64_t t = static_cast<std::int64_t>(item) / a.H;
          const int h = static_cast<int>(static_cast<std::int64_t>(item) % a.H);
          const int g = static_cast<int>(h / group);
          const BlockTable& table = *a.tables[a.seq_of[t]];
          const float* qh = a.q + (t * a.H + h) * a.D;
          std::fill(acc, acc + a.D, 0.0f);
          float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
          for (std::int64_t j = 0; j <= a.pos[t]; ++j) {
            const float* kj = kv.k_row(a.layer, table, j) + g * a.D;
            float s = 0.0f;
            for (int d = 0; d < a.D; ++d) s += qh[d] * kj[d];
            s *= a.scale;
            const float m_new = std::max(m, s);
            const float alpha = std::exp(m - m_new);  // 0 on the first key (m = -inf)
            const float p = std::exp(s - m_new);
            const float* vj = kv.v_row(a.layer, table, j) + g * a.D;
            for (int d = 0; d < a.D; ++d) acc[d] = acc[d] * alpha + p * vj[d];
            l = l * alpha + p;
            m = m_new;
          }
          float* o = a.out + (t * a.H + h) * a.D;
          const float inv_l = 1.0f / l;
          for (int d = 0; d < a.D; ++d) o[d] = acc[d] * inv_l;
        }
      },
      4);
  return ok_status();
}

}  // namespace ferry::serve
