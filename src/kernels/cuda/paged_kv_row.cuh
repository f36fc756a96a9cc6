// SPDX-License-Identifier: Apache-2.0
// The device side of the paged KV cache's addressing (PagedKvLayout / PagedStep,
// serve_kernel_args.h), shared by kv_write_kernel and the paged_attention baseline
// (paged_attention.cu) and by the fused q/k norm + rope + cache write (rope.cu,
// qk_norm_rope_kernel<true>), so every writer and reader of the cache computes the same addresses
// and stores the same bits (from_f32: a copy, or bf16 round to nearest even as the CPU's
// KvCache::write_rows).
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/serve_kernel_args.h"

namespace ferry::kernels::cuda {

// The cache row [G*D] of step token t's sequence at position j in `layer`: its K rows (which 0)
// or V rows (which 1), through the sequence's block table. Elem: float for an f32 pool, bf16
// (common.cuh) for a bf16 one (kv.bf16).
template <typename Elem>
__device__ __forceinline__ Elem* kv_row(const PagedKvLayout& kv, int layer, const PagedStep& s,
                                        std::int64_t t, std::int64_t j, int which) {
  const std::int32_t* table = s.tables + std::int64_t(s.seq_of[t]) * s.table_stride;
  const std::int64_t blk = table[j / kv.block_tokens];
  const std::int64_t row = std::int64_t(kv.G) * kv.D;
  return static_cast<Elem*>(kv.base) + std::int64_t(layer) * kv.layer_stride +
         (blk * 2 + which) * std::int64_t(kv.block_tokens) * row + (j % kv.block_tokens) * row;
}

}  // namespace ferry::kernels::cuda
