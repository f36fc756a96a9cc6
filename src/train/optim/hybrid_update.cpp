// SPDX-License-Identifier: Apache-2.0
#include "train/optim/hybrid_update.h"

#include <algorithm>

#include "core/thread_pool.h"
#include "kernels/cpu/hybrid_adamw.h"
#include "kernels/cpu/q8_code.h"

namespace ferry::train {

namespace kc = kernels::cpu;

void hybrid_update_param(kc::Isa isa, const kc::AdamWConstants& k, const OptimMode& mode,
                         ParamOptimState& st, const ParamBuffers& b, std::uint64_t sr_key) {
  const kc::MasterKind mk = mode.master == MasterWeights::kF32         ? kc::MasterKind::kF32
                            : mode.master == MasterWeights::kBf16Kahan ? kc::MasterKind::kBf16Kahan
                                                                       : kc::MasterKind::kBf16Sr;
  const kc::StateKind sk = st.q8() ? kc::StateKind::kQ8 : kc::StateKind::kF32;
  const std::int64_t block = kc::q8::kBlock;
  const std::int64_t blocks = (b.n + block - 1) / block;
  auto run = [&](std::size_t b0, std::size_t b1) {
    const std::int64_t e0 = static_cast<std::int64_t>(b0) * block;
    const std::int64_t e1 = std::min(b.n, static_cast<std::int64_t>(b1) * block);
    kc::HybridAdamWSpan s;
    s.n = e1 - e0;
    s.grad = b.grad + e0;
    s.p32 = b.master != nullptr ? b.master + e0 : nullptr;  // bf16 masters: optional view
    s.index0 = static_cast<std::uint64_t>(e0);
    s.sr_key = sr_key;
    if (mk != kc::MasterKind::kF32) s.p16 = st.w16.data() + e0;
    if (mk == kc::MasterKind::kBf16Kahan) s.comp16 = st.comp16.data() + e0;
    if (sk == kc::StateKind::kF32) {
      s.m32 = b.m32 + e0;
      s.v32 = b.v32 + e0;
    } else {
      s.m8 = st.m8.data() + e0;
      s.v8 = st.v8.data() + e0;
      s.m_absmax = st.m_absmax.data() + b0;
      s.v_absmax = st.v_absmax.data() + b0;
    }
    kc::hybrid_adamw_span(isa, mk, sk, k, s);
  };
  // 8 blocks (16384 elements) per chunk at least, like the f32 AdamW's split.
  ThreadPool::global().parallel_for(static_cast<std::size_t>(blocks), run, /*min_chunk=*/8);
}

}  // namespace ferry::train
