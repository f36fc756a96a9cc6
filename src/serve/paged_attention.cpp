// SPDX-License-Identifier: Apache-2.0
// Online softmax per (token, head): running max m, running sum l, unnormalised accumulator; keys
// read block by block through the sequence's table. Threaded over (token, head) items.
#include "serve/paged_attention.h"

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/dtype.h"

#include "core/thread_pool.h"

namespace ferry::serve {
namespace {
constexpr int kMaxHeadDim = 512;

// Element d of a cache row as f32: the f32 itself, or a bf16 widened (exact).
template <typename Elem>
float load(const std::byte* row, int d) {
  if constexpr (std::is_same_v<Elem, float>) {
    return reinterpret_cast<const float*>(row)[d];
  } else {
    return bf16_to_f32(reinterpret_cast<const std::uint16_t*>(row)[d]);
  }
}

template <typename Elem>
void attend(const KvCache& kv, const PagedAttentionArgs& a) {
  const std::int64_t items = a.T * a.H;
  const std::int64_t group = a.H / a.G;
  const std::int64_t head_bytes = std::int64_t(a.D) * std::int64_t(sizeof(Elem));
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
            const std::byte* kj = kv.k_bytes(a.layer, table, j) + g * head_bytes;
            float s = 0.0f;
            for (int d = 0; d < a.D; ++d) s += qh[d] * load<Elem>(kj, d);
            s *= a.scale;
            const float m_new = std::max(m, s);
            const float alpha = std::exp(m - m_new);  // 0 on the first key (m = -inf)
            const float p = std::exp(s - m_new);
            const std::byte* vj = kv.v_bytes(a.layer, table, j) + g * head_bytes;
            for (int d = 0; d < a.D; ++d) acc[d] = acc[d] * alpha + p * load<Elem>(vj, d);
            l = l * alpha + p;
            m = m_new;
          }
          float* o = a.out + (t * a.H + h) * a.D;
          const float inv_l = 1.0f / l;
          for (int d = 0; d < a.D; ++d) o[d] = acc[d] * inv_l;
        }
      },
      4);
}
}  // namespace

Status paged_attention(const KvCache& kv, const PagedAttentionArgs& a) {
  if (a.D > kMaxHeadDim) {
    return unimplemented("serve: paged attention supports head dim <= {}, got {}", kMaxHeadDim,
                         a.D);
  }
  if (a.G <= 0 || a.H % a.G != 0) {
    return invalid_argument("serve: {} heads not divisible by {} kv heads", a.H, a.G);
  }
  if (kv.dtype() == DType::kBF16) {
    attend<std::uint16_t>(kv, a);
  } else {
    attend<float>(kv, a);
  }
  return ok_status();
}

}  // namespace ferry::serve
