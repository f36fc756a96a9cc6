// SPDX-License-Identifier: Apache-2.0
#include "serve/kv_cache.h"

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
  mem::ArenaPlan plan;
  const mem::SlotId id = plan.add("kv blocks", std::size_t(c->num_blocks_) * per_block);
  FERRY_ASSIGN_OR_RETURN(c->shared_charge_,
                         BudgetCharge::take(shared, plan.allocation_bytes(), "kv block pool"));
  FERRY_ASSIGN_OR_RETURN(c->arena_, mem::make_arena(plan, cpu_engine_pool_tier(), c->budget_,
                                                    {.what = "kv block pool"}));
  c->base_ = c->arena_.as<float>(id);
  c->free_.reserve(c->num_blocks_);
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
  for (std::int32_t b : table.blocks) free_.push_back(b);
  table.blocks.clear();
}

float* KvCache::row(int layer, const BlockTable& table, std::int64_t pos, int kv_index) const {
  const std::int64_t bi = pos / block_tokens_;
  FERRY_CHECK(pos >= 0 && bi < static_cast<std::int64_t>(table.blocks.size()),
              "serve: kv position {} outside a table of {} blocks", pos, table.blocks.size());
  const std::int64_t block = table.blocks[bi];
  const std::int64_t off =
      ((std::int64_t(layer) * num_blocks_ + block) * 2 + kv_index) * block_tokens_ +
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
