// SPDX-License-Identifier: Apache-2.0
#include "serve/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/check.h"
#include "serve/pool_tier.h"

namespace ferry::serve {

KvCache::KvCache(const model::DecoderGeometry& geo, const KvConfig& kv)
    : layers_(geo.layers),
      row_floats_(geo.kv_heads * geo.head_dim),
      block_tokens_(kv.block_tokens),
      budget_(cpu_engine_pool_tier(), kv.budget_bytes) {}

std::size_t KvCache::block_bytes() const {
  return std::size_t(layers_) * 2 * std::size_t(block_tokens_) * std::size_t(row_floats_) *
         sizeof(float);
}

Result<std::unique_ptr<KvCache>> KvCache::create(const model::DecoderGeometry& geo,
                                                 const KvConfig& kv, mem::MemoryBudget* shared) {
  if (kv.block_tokens <= 0) {
    return invalid_argument("serve: kv block size must be positive, got {}", kv.block_tokens);
  }
  std::unique_ptr<KvCache> c(new KvCache(geo, kv));
  const std::size_t per_block = c->block_bytes();
  // The arena may pad its base to the 256-byte alignment every tier guarantees: nothing extra.
  const std::size_t blocks = kv.budget_bytes / per_block;
  if (blocks == 0) {
    return resource_exhausted(
        "serve: kv budget of {} holds no block (one block of {} tokens needs {})",
        mem::format_bytes(kv.budget_bytes), kv.block_tokens, mem::format_bytes(per_block));
  }
  c->num_blocks_ = static_cast<int>(std::min<std::size_t>(blocks, 1u << 30));
  c->capacity_blocks_ = c->num_blocks_;
  const bool resizable = kv.max_budget_bytes > 0;
  if (resizable) {
    c->capacity_blocks_ = static_cast<int>(std::min<std::size_t>(
        std::max(kv.max_budget_bytes / per_block, std::size_t(c->num_blocks_)), 1u << 30));
    FERRY_TRY(c->budget_.set_limit(
        std::max(kv.budget_bytes, std::size_t(c->capacity_blocks_) * per_block + 4096)));
  }
  mem::ArenaPlan plan;
  const mem::SlotId id = plan.add("kv blocks", std::size_t(c->capacity_blocks_) * per_block);
  FERRY_ASSIGN_OR_RETURN(
      c->shared_charge_,
      BudgetCharge::take(
          shared, resizable ? std::size_t(c->num_blocks_) * per_block : plan.allocation_bytes(),
          "kv block pool"));
  FERRY_ASSIGN_OR_RETURN(c->arena_, mem::make_arena(plan, cpu_engine_pool_tier(), c->budget_,
                                                    {.what = "kv block pool"}));
  c->base_ = c->arena_.as<float>(id);
  c->free_.reserve(std::size_t(c->capacity_blocks_));
  for (int b = c->num_blocks_ - 1; b >= 0; --b) c->free_.push_back(b);
  return c;
}

Status KvCache::reserve(BlockTable& table, std::int64_t tokens) {
  const int need = blocks_for(tokens) - static_cast<int>(table.blocks.size());
  if (need <= 0) return ok_status();
  if (need > free_blocks()) {
    return resource_exhausted("serve: kv cache needs {} more blocks, {} of {} free", need,
                              free_blocks(), num_blocks_);
  }
  for (int i = 0; i < need; ++i) {
    table.blocks.push_back(free_.back());
    free_.pop_back();
  }
  return ok_status();
}

void KvCache::release(BlockTable& table) {
  for (std::int32_t b : table.blocks) {
    // Keep the list descending so the lowest id is handed out next (resize() shrinks the top).
    free_.insert(std::upper_bound(free_.begin(), free_.end(), b, std::greater<>()), b);
  }
  table.blocks.clear();
}

Status KvCache::resize(int blocks, std::span<BlockTable* const> tables) {
  if (blocks < 1 || blocks > capacity_blocks_) {
    return invalid_argument("serve: kv resize to {} blocks outside [1, {}]", blocks,
                            capacity_blocks_);
  }
  if (blocks < used_blocks()) {
    return invalid_argument("serve: kv resize to {} blocks below the {} in use", blocks,
                            used_blocks());
  }
  const std::size_t per_block = block_bytes();
  if (blocks > num_blocks_) {
    FERRY_TRY(shared_charge_.resize(std::size_t(blocks) * per_block, "kv block pool"));
    for (int b = num_blocks_; b < blocks; ++b) free_.insert(free_.begin(), b);
    num_blocks_ = blocks;
    return ok_status();
  }
  // Move used blocks at or above the new size into the lowest free ids below it.
  const std::size_t block_floats = std::size_t(block_tokens_) * std::size_t(row_floats_);
  for (BlockTable* t : tables) {
    for (std::int32_t& b : t->blocks) {
      if (b < blocks) continue;
      FERRY_CHECK(!free_.empty() && free_.back() < blocks, "serve: kv resize found no free block");
      const std::int32_t to = free_.back();
      free_.pop_back();
      for (int l = 0; l < layers_; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          const auto at = [&](std::int64_t blk) {
            return base_ + ((std::int64_t(l) * capacity_blocks_ + blk) * 2 + kv) *
                               std::int64_t(block_floats);
          };
          std::memcpy(at(to), at(b), block_floats * sizeof(float));
        }
      }
      free_.insert(std::upper_bound(free_.begin(), free_.end(), b, std::greater<>()), b);
      b = to;
      ++blocks_moved_;
    }
  }
  std::erase_if(free_, [&](std::int32_t b) { return b >= blocks; });
  num_blocks_ = blocks;
  FERRY_TRY(shared_charge_.resize(std::size_t(blocks) * per_block, "kv block pool"));
  return ok_status();
}

float* KvCache::row(int layer, const BlockTable& table, std::int64_t pos, int kv_index) const {
  const std::int64_t bi = pos / block_tokens_;
  FERRY_CHECK(pos >= 0 && bi < static_cast<std::int64_t>(table.blocks.size()),
              "serve: kv position {} outside a table of {} blocks", pos, table.blocks.size());
  const std::int64_t block = table.blocks[bi];
  const std::int64_t off =
      ((std::int64_t(layer) * capacity_blocks_ + block) * 2 + kv_index) * block_tokens_ +
      pos % block_tokens_;
  return base_ + off * row_floats_;
}

float* KvCache::k_row(int layer, const BlockTable& t, std::int64_t pos) {
  return row(layer, t, pos, 0);
}
float* KvCache::v_row(int layer, const BlockTable& t, std::int64_t pos) {
  return row(layer, t, pos, 1);
}
const float* KvCache::k_row(int layer, const BlockTable& t, std::int64_t pos) const {
  return row(layer, t, pos, 0);
}
const float* KvCache::v_row(int layer, const BlockTable& t, std::int64_t pos) const {
  return row(layer, t, pos, 1);
}

}  // namespace ferry::serve
