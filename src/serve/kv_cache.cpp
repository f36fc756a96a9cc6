// SPDX-License-Identifier: Apache-2.0
#include "serve/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/check.h"
#include "serve/pool_tier.h"

namespace ferry::serve {

namespace {
std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
}  // namespace

KvCache::KvCache(const model::DecoderGeometry& geo, const KvConfig& kv, mem::MemTier tier)
    : layers_(geo.layers),
      row_elems_(geo.kv_heads * geo.head_dim),
      dtype_(kv.dtype),
      row_bytes_(std::size_t(row_elems_) * dtype_size(kv.dtype)),
      block_tokens_(kv.block_tokens),
      budget_(tier, kv.budget_bytes),
      prefix_cache_(kv.prefix_cache) {}

std::size_t kv_block_bytes(const model::DecoderGeometry& geo, int block_tokens, DType dtype) {
  return std::size_t(geo.layers) * 2 * std::size_t(block_tokens) * std::size_t(geo.kv_heads) *
         std::size_t(geo.head_dim) * dtype_size(dtype);
}

std::size_t KvCache::block_bytes() const { return std::size_t(layers_) * block_span_bytes(); }

Result<std::unique_ptr<KvCache>> KvCache::create(const model::DecoderGeometry& geo,
                                                 const KvConfig& kv, mem::MemoryBudget* shared,
                                                 std::optional<mem::MemTier> tier) {
  if (kv.block_tokens <= 0) {
    return invalid_argument("serve: kv block size must be positive, got {}", kv.block_tokens);
  }
  if (kv.dtype != DType::kF32 && kv.dtype != DType::kBF16) {
    return invalid_argument("serve: kv dtype {} (f32 or bf16)", to_string(kv.dtype));
  }
  std::unique_ptr<KvCache> c(new KvCache(geo, kv, tier.value_or(cpu_engine_pool_tier())));
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
  c->layer_stride_bytes_ = std::size_t(c->capacity_blocks_) * c->block_span_bytes();
  if (resizable) {
    // The shared budget is charged the live blocks; the pool's own budget the committed granules.
    FERRY_ASSIGN_OR_RETURN(std::size_t gran,
                           mem::VirtualRegion::tier_granularity(c->budget_.tier()));
    if (kv.granularity_bytes > 0) gran = kv.granularity_bytes;
    c->layer_stride_bytes_ = round_up(c->layer_stride_bytes_, gran);
    const std::size_t reserved = std::size_t(c->layers_) * c->layer_stride_bytes_;
    FERRY_TRY(c->budget_.set_limit(std::max(kv.budget_bytes, reserved)));
    FERRY_ASSIGN_OR_RETURN(
        c->shared_charge_,
        BudgetCharge::take(shared, std::size_t(c->num_blocks_) * per_block, "kv block pool"));
    FERRY_ASSIGN_OR_RETURN(c->region_,
                           mem::VirtualRegion::reserve(
                               c->budget_.tier(), reserved, c->budget_,
                               {.granularity = kv.granularity_bytes, .what = "kv block pool"}));
    c->base_ = c->region_.data();
    FERRY_TRY(c->commit_blocks(c->num_blocks_));
  } else {
    mem::ArenaPlan plan;
    const mem::SlotId id = plan.add("kv blocks", std::size_t(c->capacity_blocks_) * per_block);
    FERRY_ASSIGN_OR_RETURN(c->shared_charge_,
                           BudgetCharge::take(shared, plan.allocation_bytes(), "kv block pool"));
    FERRY_ASSIGN_OR_RETURN(
        c->arena_, mem::make_arena(plan, c->budget_.tier(), c->budget_, {.what = "kv block pool"}));
    c->base_ = c->arena_.data(id);
  }
  const std::size_t cap = std::size_t(c->capacity_blocks_);
  c->free_.reserve(cap);
  for (int b = c->num_blocks_ - 1; b >= 0; --b) c->free_.push_back(b);
  c->ref_.assign(cap, 0);
  if (c->prefix_cache_) {
    c->stamp_.assign(cap, 0);
    c->hash_.assign(cap, 0);
    c->parent_stamp_.assign(cap, 0);
    c->in_map_.assign(cap, 0);
    c->tokens_.assign(cap * std::size_t(kv.block_tokens), 0);
    c->lru_prev_.assign(cap, -1);
    c->lru_next_.assign(cap, -1);
    c->map_.reserve(cap);
  }
  return c;
}

std::size_t KvCache::held_bytes() const {
  return resizable() ? region_.held_bytes() : arena_.buffer().size();
}

std::size_t KvCache::reserved_bytes() const {
  return resizable() ? region_.size() : arena_.buffer().size();
}

Status KvCache::commit_blocks(int blocks) {
  const std::size_t used = std::size_t(blocks) * block_span_bytes();
  for (int l = 0; l < layers_; ++l) {
    FERRY_TRY(region_.commit(std::size_t(l) * layer_stride_bytes_, used));
  }
  return ok_status();
}

Status KvCache::decommit_blocks(int blocks) {
  const std::size_t used = std::size_t(blocks) * block_span_bytes();
  for (int l = 0; l < layers_; ++l) {
    FERRY_TRY(
        region_.decommit(std::size_t(l) * layer_stride_bytes_ + used, layer_stride_bytes_ - used));
  }
  return ok_status();
}

std::uint64_t KvCache::block_hash(std::uint64_t prev, const std::int32_t* tokens) const {
  // FNV-1a over the previous hash and the block's ids, then a splitmix finaliser. Collisions are
  // harmless (match_prefix compares exactly); this only has to spread keys.
  std::uint64_t h = 0xcbf29ce484222325ull ^ prev;
  for (int i = 0; i < block_tokens_; ++i) {
    h ^= std::uint32_t(tokens[i]);
    h *= 0x100000001b3ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

void KvCache::give_back_free(std::int32_t b) {
  // Keep the list descending so the lowest id is handed out next (resize() shrinks the top).
  free_.insert(std::upper_bound(free_.begin(), free_.end(), b, std::greater<>()), b);
}

void KvCache::lru_push_back(std::int32_t b) {
  lru_prev_[std::size_t(b)] = lru_tail_;
  lru_next_[std::size_t(b)] = -1;
  if (lru_tail_ >= 0) {
    lru_next_[std::size_t(lru_tail_)] = b;
  } else {
    lru_head_ = b;
  }
  lru_tail_ = b;
  ++cached_;
}

void KvCache::lru_remove(std::int32_t b) {
  const std::int32_t p = lru_prev_[std::size_t(b)], n = lru_next_[std::size_t(b)];
  (p >= 0 ? lru_next_[std::size_t(p)] : lru_head_) = n;
  (n >= 0 ? lru_prev_[std::size_t(n)] : lru_tail_) = p;
  lru_prev_[std::size_t(b)] = lru_next_[std::size_t(b)] = -1;
  --cached_;
}

void KvCache::lru_replace(std::int32_t from, std::int32_t to) {
  const std::int32_t p = lru_prev_[std::size_t(from)], n = lru_next_[std::size_t(from)];
  lru_prev_[std::size_t(to)] = p;
  lru_next_[std::size_t(to)] = n;
  (p >= 0 ? lru_next_[std::size_t(p)] : lru_head_) = to;
  (n >= 0 ? lru_prev_[std::size_t(n)] : lru_tail_) = to;
  lru_prev_[std::size_t(from)] = lru_next_[std::size_t(from)] = -1;
}

void KvCache::evict(std::int32_t b) {
  FERRY_CHECK(ref_[std::size_t(b)] == 0, "serve: kv evicting block {} with {} references", b,
              ref_[std::size_t(b)]);
  lru_remove(b);
  if (in_map_[std::size_t(b)]) {
    map_.erase(hash_[std::size_t(b)]);
    in_map_[std::size_t(b)] = 0;
  }
  stamp_[std::size_t(b)] = 0;  // its children can no longer be matched through it
  ++counters_.evictions;
}

std::int32_t KvCache::take_block() {
  std::int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    FERRY_CHECK(cached_ > 0, "serve: kv take_block with nothing free or cached");
    b = lru_head_;
    evict(b);
  }
  if (prefix_cache_) stamp_[std::size_t(b)] = 0;
  ref_[std::size_t(b)] = 1;
  return b;
}

template <typename OnBlock>
std::uint64_t KvCache::walk_cached(std::span<const std::int32_t> tokens, int most,
                                   OnBlock&& on_block) const {
  std::uint64_t h = 0, parent = 0;
  for (int i = 0; i < most; ++i) {
    const std::int32_t* ids = tokens.data() + std::size_t(i) * std::size_t(block_tokens_);
    const std::uint64_t hi = block_hash(h, ids);
    const auto it = map_.find(hi);
    if (it == map_.end()) break;
    const std::int32_t b = it->second;
    const std::int32_t* have = tokens_.data() + std::size_t(b) * std::size_t(block_tokens_);
    if (parent_stamp_[std::size_t(b)] != parent || !std::equal(ids, ids + block_tokens_, have)) {
      break;  // a hash collision: not the same prefix
    }
    on_block(b);
    h = hi;
    parent = stamp_[std::size_t(b)];
  }
  return h;
}

int KvCache::cached_prefix_blocks(std::span<const std::int32_t> tokens) const {
  if (!prefix_cache_ || tokens.empty()) return 0;
  int n = 0;
  walk_cached(tokens, static_cast<int>((std::int64_t(tokens.size()) - 1) / block_tokens_),
              [&n](std::int32_t) { ++n; });
  return n;
}

int KvCache::match_prefix(BlockTable& table, std::span<const std::int32_t> tokens) {
  FERRY_CHECK(table.blocks.empty(), "serve: match_prefix into a table holding {} blocks",
              table.blocks.size());
  if (!prefix_cache_ || tokens.empty()) return 0;
  const int most = static_cast<int>((std::int64_t(tokens.size()) - 1) / block_tokens_);
  ++counters_.lookups;
  counters_.query_blocks += std::uint64_t(most);
  const std::uint64_t h = walk_cached(tokens, most, [&](std::int32_t b) {
    if (ref_[std::size_t(b)]++ == 0) lru_remove(b);
    table.blocks.push_back(b);
  });
  const int n = static_cast<int>(table.blocks.size());
  if (observer_) {
    // The whole chain the request could have matched (hashes past the first miss too).
    last_chain_.clear();
    std::uint64_t c = 0;
    for (int i = 0; i < most; ++i) {
      c = block_hash(c, tokens.data() + std::size_t(i) * std::size_t(block_tokens_));
      last_chain_.push_back(c);
    }
  }
  table.identified = n;
  table.chain_hash = h;
  table.chain_stopped = false;
  counters_.hit_blocks += std::uint64_t(n);
  return n;
}

void KvCache::commit_full_blocks(BlockTable& table, std::span<const std::int32_t> tokens,
                                 std::int64_t computed) {
  if (!prefix_cache_ || table.chain_stopped) return;
  const int full = static_cast<int>(std::min<std::int64_t>(
      computed / block_tokens_, static_cast<std::int64_t>(table.blocks.size())));
  FERRY_CHECK(std::int64_t(tokens.size()) >= std::int64_t(full) * block_tokens_,
              "serve: commit of {} blocks with {} token ids", full, tokens.size());
  for (int i = table.identified; i < full; ++i) {
    const std::int32_t b = table.blocks[std::size_t(i)];
    const std::int32_t* ids = tokens.data() + std::size_t(i) * std::size_t(block_tokens_);
    const std::uint64_t h = block_hash(table.chain_hash, ids);
    if (map_.contains(h)) {
      // The same content (or a colliding hash) is already cached: this copy stays anonymous and
      // is freed with its table; so are the table's later blocks (their parent is anonymous).
      table.chain_stopped = true;
      return;
    }
    stamp_[std::size_t(b)] = next_stamp_++;
    hash_[std::size_t(b)] = h;
    parent_stamp_[std::size_t(b)] =
        i == 0 ? 0 : stamp_[std::size_t(table.blocks[std::size_t(i - 1)])];
    std::copy(ids, ids + block_tokens_,
              tokens_.begin() + std::ptrdiff_t(b) * std::ptrdiff_t(block_tokens_));
    map_.emplace(h, b);
    in_map_[std::size_t(b)] = 1;
    ++counters_.registered;
    table.identified = i + 1;
    table.chain_hash = h;
  }
}

Status KvCache::reserve(BlockTable& table, std::int64_t tokens) {
  const int need = blocks_for(tokens) - static_cast<int>(table.blocks.size());
  if (need <= 0) return ok_status();
  if (need > free_blocks()) {
    return resource_exhausted("serve: kv cache needs {} more blocks, {} of {} free", need,
                              free_blocks(), num_blocks_);
  }
  for (int i = 0; i < need; ++i) table.blocks.push_back(take_block());
  return ok_status();
}

void KvCache::release(BlockTable& table) {
  // Tail first: of one chain, the later blocks become the least recently released (evicted
  // before the head that every later match needs).
  for (auto it = table.blocks.rbegin(); it != table.blocks.rend(); ++it) {
    const std::int32_t b = *it;
    FERRY_CHECK(ref_[std::size_t(b)] > 0, "serve: kv release of unreferenced block {}", b);
    if (--ref_[std::size_t(b)] > 0) continue;
    if (prefix_cache_ && in_map_[std::size_t(b)]) {
      lru_push_back(b);
      if (observer_) observer_(false, std::span<const std::uint64_t>(&hash_[std::size_t(b)], 1), 0);
    } else {
      if (prefix_cache_) stamp_[std::size_t(b)] = 0;
      give_back_free(b);
    }
  }
  table.blocks.clear();
  table.identified = 0;
  table.chain_hash = 0;
  table.chain_stopped = false;
}

void KvCache::move_block(std::int32_t from, std::int32_t to) {
  moves_.emplace_back(from, to);  // the rows follow in copy_moved_rows()
  ref_[std::size_t(to)] = ref_[std::size_t(from)];
  ref_[std::size_t(from)] = 0;
  if (prefix_cache_) {
    // The identity moves with the content (stamps are unique, so children still find it).
    stamp_[std::size_t(to)] = stamp_[std::size_t(from)];
    hash_[std::size_t(to)] = hash_[std::size_t(from)];
    parent_stamp_[std::size_t(to)] = parent_stamp_[std::size_t(from)];
    in_map_[std::size_t(to)] = in_map_[std::size_t(from)];
    std::copy_n(tokens_.begin() + std::ptrdiff_t(from) * block_tokens_, block_tokens_,
                tokens_.begin() + std::ptrdiff_t(to) * block_tokens_);
    if (in_map_[std::size_t(to)]) map_[hash_[std::size_t(to)]] = to;
    stamp_[std::size_t(from)] = 0;
    in_map_[std::size_t(from)] = 0;
  }
  ++blocks_moved_;
}

Status KvCache::copy_moved_rows() {
  // Sources are all >= the new size and destinations all below it, so the copies are disjoint
  // and may run in any order. Runs of consecutive sources going to consecutive destinations are
  // one copy per layer: in a layer, block b's K rows, V rows, then block b + 1's are contiguous.
  std::sort(moves_.begin(), moves_.end());
  const bool device = tier() == mem::MemTier::kDevice && !mem::device_tier_is_host_memory();
  std::size_t i = 0;
  while (i < moves_.size()) {
    std::size_t n = 1;
    while (i + n < moves_.size() && moves_[i + n].first == moves_[i].first + std::int32_t(n) &&
           moves_[i + n].second == moves_[i].second + std::int32_t(n)) {
      ++n;
    }
    const std::size_t bytes = n * block_span_bytes();
    for (int l = 0; l < layers_; ++l) {
      const auto at = [&](std::int64_t blk) {
        return base_ + std::size_t(l) * layer_stride_bytes_ + std::size_t(blk) * block_span_bytes();
      };
      std::byte* dst = at(moves_[i].second);
      const std::byte* src = at(moves_[i].first);
      if (device) {
        FERRY_TRY(copy_te_->d2d(dst, src, bytes, *copy_stream_));
      } else {
        std::memcpy(dst, src, bytes);
      }
    }
    i += n;
  }
  moves_.clear();
  return ok_status();
}

Status KvCache::resize(int blocks, std::span<BlockTable* const> tables) {
  if (tier() == mem::MemTier::kDevice && !mem::device_tier_is_host_memory() &&
      (copy_te_ == nullptr || copy_stream_ == nullptr)) {
    return unimplemented("serve: kv resize of a pool in GPU memory without a device copier");
  }
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
    if (resizable()) {
      // Backed before any block is handed out; refused (out of memory): nothing changes.
      if (Status st = commit_blocks(blocks); !st.ok()) {
        FERRY_CHECK_OK(decommit_blocks(num_blocks_));
        FERRY_CHECK_OK(
            shared_charge_.resize(std::size_t(num_blocks_) * per_block, "kv block pool"));
        return st;
      }
    }
    for (int b = num_blocks_; b < blocks; ++b) free_.insert(free_.begin(), b);
    num_blocks_ = blocks;
    return ok_status();
  }
  // Drop cached blocks, least recently released first, until everything live fits the new size.
  while (used_blocks() + cached_ > blocks) {
    const std::int32_t b = lru_head_;
    evict(b);
    give_back_free(b);
  }
  // Every live block at or above the new size moves once into the lowest free id below it; the
  // tables (a shared block may sit in several) are rewritten through one map.
  std::vector<std::int32_t> moved_to(std::size_t(num_blocks_) - std::size_t(blocks), -1);
  std::erase_if(free_, [&](std::int32_t b) { return b >= blocks; });
  auto relocate = [&](std::int32_t b) {
    std::int32_t& to = moved_to[std::size_t(b - blocks)];
    if (to < 0) {
      FERRY_CHECK(!free_.empty(), "serve: kv resize found no free block");
      to = free_.back();
      free_.pop_back();
      if (ref_[std::size_t(b)] == 0) lru_replace(b, to);  // a cached block keeps its LRU place
      move_block(b, to);
    }
    return to;
  };
  for (BlockTable* t : tables) {
    for (std::int32_t& b : t->blocks) {
      if (b >= blocks) b = relocate(b);
    }
  }
  if (prefix_cache_) {
    // Cached survivors above the new size (no table holds them).
    for (std::int32_t b = blocks; b < num_blocks_; ++b) {
      if (ref_[std::size_t(b)] == 0 && in_map_[std::size_t(b)]) relocate(b);
    }
  }
  FERRY_TRY(copy_moved_rows());
  num_blocks_ = blocks;
  if (resizable()) {
    // The moved rows' sources are the granules about to go: on the device they must have landed
    // (the copier's stream, which also ran every kernel touching the pool).
    if (copy_stream_ != nullptr && tier() == mem::MemTier::kDevice &&
        !mem::device_tier_is_host_memory()) {
      FERRY_TRY(copy_stream_->synchronize());
    }
    FERRY_TRY(decommit_blocks(blocks));
  }
  FERRY_TRY(shared_charge_.resize(std::size_t(blocks) * per_block, "kv block pool"));
  return ok_status();
}

std::byte* KvCache::row(int layer, const BlockTable& table, std::int64_t pos, int kv_index) const {
  const std::int64_t bi = pos / block_tokens_;
  FERRY_CHECK(pos >= 0 && bi < static_cast<std::int64_t>(table.blocks.size()),
              "serve: kv position {} outside a table of {} blocks", pos, table.blocks.size());
  const std::int64_t block = table.blocks[bi];
  const std::int64_t off = (block * 2 + kv_index) * block_tokens_ + pos % block_tokens_;
  return base_ + std::size_t(layer) * layer_stride_bytes_ + std::size_t(off) * row_bytes_;
}

float* KvCache::f32_row(int layer, const BlockTable& t, std::int64_t pos, int kv_index) const {
  FERRY_CHECK(dtype_ == DType::kF32, "serve: an f32 row of a {} kv pool", to_string(dtype_));
  return reinterpret_cast<float*>(row(layer, t, pos, kv_index));
}

float* KvCache::base() const {
  FERRY_CHECK(dtype_ == DType::kF32, "serve: the f32 base of a {} kv pool", to_string(dtype_));
  return reinterpret_cast<float*>(base_);
}

void KvCache::write_rows(int layer, const BlockTable& t, std::int64_t pos, const float* k,
                         const float* v) {
  std::byte* kr = row(layer, t, pos, 0);
  std::byte* vr = row(layer, t, pos, 1);
  if (dtype_ == DType::kF32) {
    std::memcpy(kr, k, row_bytes());
    std::memcpy(vr, v, row_bytes());
    return;
  }
  auto* kb = reinterpret_cast<std::uint16_t*>(kr);
  auto* vb = reinterpret_cast<std::uint16_t*>(vr);
  for (int i = 0; i < row_elems_; ++i) {
    kb[i] = f32_to_bf16(k[i]);
    vb[i] = f32_to_bf16(v[i]);
  }
}

float* KvCache::k_row(int layer, const BlockTable& t, std::int64_t pos) {
  return f32_row(layer, t, pos, 0);
}
float* KvCache::v_row(int layer, const BlockTable& t, std::int64_t pos) {
  return f32_row(layer, t, pos, 1);
}
const float* KvCache::k_row(int layer, const BlockTable& t, std::int64_t pos) const {
  return f32_row(layer, t, pos, 0);
}
const float* KvCache::v_row(int layer, const BlockTable& t, std::int64_t pos) const {
  return f32_row(layer, t, pos, 1);
}

}  // namespace ferry::serve
