// SPDX-License-Identifier: Apache-2.0
// Causal grouped-query attention of a step's query tokens against the paged KV cache (CPU, f32
// arithmetic; a bf16 cache's rows are widened exactly as they are read, so its result is the f32
// cache's on the same rounded rows, bit for bit).
// Query token t belongs to sequence seq_of[t] and sits at position pos[t]; it attends to keys at
// positions [0, pos[t]] of its own sequence, which must already be in the cache (the runner writes
// the step's K/V rows first). Query head h reads kv head h / (H / G).
// Each (token, head) is computed alone, in one online-softmax pass over its positions in order, so
// its result does not depend on which other tokens share the step (batching, chunking) — the
// property byte identity across schedules would need.
// Slow twin: the backend's packed causal attention over whole sequences
// (tests/unit/serve/paged_attention_test.cpp).
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "serve/kv_cache.h"

namespace ferry::serve {

struct PagedAttentionArgs {
  float* out = nullptr;                       // [T, H, D]
  const float* q = nullptr;                   // [T, H, D], rope applied
  const std::int32_t* seq_of = nullptr;       // [T] index into tables
  const std::int32_t* pos = nullptr;          // [T]
  std::span<const BlockTable* const> tables;  // [S]
  std::int64_t T = 0;
  int layer = 0, H = 0, G = 0, D = 0;
  float scale = 0.0f;  // usually 1/sqrt(D)
};

Status paged_attention(const KvCache& kv, const PagedAttentionArgs& a);

}  // namespace ferry::serve
