// SPDX-License-Identifier: Apache-2.0
// The paged KV cache: a pool of fixed-size blocks (block_tokens positions each) in one Arena on
// the device tier (emulated in CPU builds), charged to a byte budget; a sequence owns a
// BlockTable (block ids in position order). A block id names the same block in every layer, so
// one table serves the whole model.
// Layout, per layer l and block b: K rows then V rows, each [block_tokens, G*D] f32:
//   k(l, b) = base + ((l * num_blocks + b) * 2 + 0) * block_tokens * G*D
//   v(l, b) = base + ((l * num_blocks + b) * 2 + 1) * block_tokens * G*D
// Invariants: a block is in at most one table or on the free list; reserve() either grows a table
// to the requested size or changes nothing (resource_exhausted). Not thread-safe: the engine's
// step owns it.
// Resizing (MV-WSA): the layout strides by capacity_blocks() (KvConfig::max_budget_bytes), so a
// block never moves when the live count changes. Free blocks are handed out lowest id first, so
// the top of the pool tends to be free; resize() below a used block moves that block's K/V (all
// layers) into a free block under the new size and rewrites its table entry. The shared device
// budget is charged the live blocks only.
// Tests: tests/unit/serve/kv_cache_test.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/result.h"
#include "mem/arena.h"
#include "mem/budget.h"
#include "model/model_compute.h"
#include "serve/budget_charge.h"
#include "serve/serve_config.h"

namespace ferry::serve {

struct BlockTable {
  std::vector<std::int32_t> blocks;  // block ids, position p lives in blocks[p / block_tokens]
};

class KvCache {
 public:
  // Sizes the pool from kv.budget_bytes: as many whole blocks as fit (at least one, else
  // resource_exhausted naming the bytes one block needs).
  // shared: the engine's device budget, charged the pool's bytes as well (may be null).
  static Result<std::unique_ptr<KvCache>> create(const model::DecoderGeometry& geo,
                                                 const KvConfig& kv,
                                                 mem::MemoryBudget* shared = nullptr);

  int block_tokens() const { return block_tokens_; }
  int num_blocks() const { return num_blocks_; }
  int capacity_blocks() const { return capacity_blocks_; }
  int used_blocks() const { return num_blocks_ - free_blocks(); }
  std::uint64_t blocks_moved() const { return blocks_moved_; }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  int blocks_for(std::int64_t tokens) const {
    return static_cast<int>((tokens + block_tokens_ - 1) / block_tokens_);
  }
  std::size_t block_bytes() const;  // one block id across all layers, K and V
  const mem::MemoryBudget& budget() const { return budget_; }

  // Grows `table` to cover `tokens` positions. All or nothing.
  Status reserve(BlockTable& table, std::int64_t tokens);
  // Returns every block of `table` to the pool and clears it.
  void release(BlockTable& table);
  // Sets the live block count. `tables` must be every table holding blocks (blocks above the new
  // size are moved and the tables rewritten). invalid_argument: outside [1, capacity] or below the
  // blocks in use; resource_exhausted: the shared budget cannot take the growth (no change).
  Status resize(int blocks, std::span<BlockTable* const> tables);

  // The K / V row of position `pos` in `table`, [G*D] f32. pos must be covered (a bug otherwise).
  float* k_row(int layer, const BlockTable& table, std::int64_t pos);
  float* v_row(int layer, const BlockTable& table, std::int64_t pos);
  const float* k_row(int layer, const BlockTable& table, std::int64_t pos) const;
  const float* v_row(int layer, const BlockTable& table, std::int64_t pos) const;

 private:
  KvCache(const model::DecoderGeometry& geo, const KvConfig& kv);
  float* row(int layer, const BlockTable& table, std::int64_t pos, int kv_index) const;

  int layers_ = 0;
  int row_floats_ = 0;  // G*D
  int block_tokens_ = 0;
  int num_blocks_ = 0;
  int capacity_blocks_ = 0;  // the layout's stride: blocks the arena holds
  std::uint64_t blocks_moved_ = 0;
  mem::MemoryBudget budget_;
  BudgetCharge shared_charge_;
  mem::Arena arena_;
  float* base_ = nullptr;
  std::vector<std::int32_t> free_;  // descending: back() is the lowest free id
};

}  // namespace ferry::serve
