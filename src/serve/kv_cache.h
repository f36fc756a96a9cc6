// SPDX-License-Identifier: Apache-2.0
// The paged KV cache: a pool of fixed-size blocks (block_tokens positions each) in one Arena on
// the device tier (emulated in CPU builds), charged to a byte budget; a sequence owns a
// BlockTable (block ids in position order). A block id names the same block in every layer, so
// one table serves the whole model.
// Layout, per layer l and block b: K rows then V rows, each [block_tokens, G*D] elements of
// dtype() (KvConfig::dtype: f32, or bf16 bits -- rows rounded to nearest even by write_rows and
// widened exactly by their readers, paged_attention.h):
//   k(l, b) = base + ((l * capacity + b) * 2 + 0) * block_tokens * G*D
//   v(l, b) = base + ((l * capacity + b) * 2 + 1) * block_tokens * G*D
// Invariants: a block is in at most one table or on the free list; reserve() either grows a table
// to the requested size or changes nothing (resource_exhausted). Not thread-safe: the engine's
// step owns it.
// Resizing (MV-WSA): the layout strides by capacity_blocks() (KvConfig::max_budget_bytes), so a
// block never moves when the live count changes. Free blocks are handed out lowest id first, so
// the top of the pool tends to be free; resize() below a used block moves that block's K/V (all
// layers) into a free block under the new size and rewrites its table entry. The shared device
// budget is charged the live blocks only, and only they are backed by memory: a resizable pool
// lives in a mem::VirtualRegion whose layers each start on a granule (the layer stride is
// capacity_blocks() blocks rounded up to a granule), and blocks [0, num_blocks()) of every layer
// are committed, so the memory held follows the live size (held_bytes(): the live blocks plus
// less than a granule per layer), not the capacity (reserved_bytes()). A shrink decommits the
// granules wholly above the new size once the moved rows have landed (on the device: after a
// sync of the copier's stream, the one shrink costs). The moves are host memcpys for a pool in host
// memory; for a pool in GPU memory (the CUDA engine) they are device-to-device copies enqueued on
// the stream given to set_device_copier() -- the engine's compute stream, which wrote the rows and
// reads them next, so no host sync is needed -- one copy per layer and run of consecutive blocks.
// Prefix cache (KvConfig::prefix_cache, vLLM's automatic prefix caching): a block whose
// block_tokens positions are all computed gets a content identity -- a hash chained over its
// token ids and those of every earlier block of its table -- and is entered in a hash -> block
// map. Blocks are reference counted: a table holds one reference on each of its blocks, and a
// block shared by several tables (a common prefix) has several. When the last reference goes, a
// block with an identity stays cached (evictable, in an LRU list; a table's blocks are queued
// tail first, so a chain loses its tail before its head) until reserve() needs its memory; one
// without goes back to the free list. match_prefix() hands a new table the longest cached
// block-aligned prefix of its tokens. A hash hit is verified exactly -- the block's own token ids
// and the identity (stamp) of the block before it, so by induction the whole prefix -- hence no
// false sharing on a collision. A cached block is never written: a table computes only past its
// matched blocks, and at least its last token is always left to compute.
// Block states: free (no content) -> in use (ref >= 1) -> cached (ref 0, evictable) -> in use
// again (matched) or free (evicted). free_blocks() counts free + cached (what reserve can have),
// used_blocks() the referenced ones.
// Tests: tests/unit/serve/kv_cache_test.cpp, prefix_cache_test.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/result.h"
#include "mem/arena.h"
#include "mem/budget.h"
#include "mem/stream.h"
#include "mem/transfer_engine.h"
#include "mem/virtual_region.h"
#include "model/model_compute.h"
#include "serve/budget_charge.h"
#include "serve/serve_config.h"

namespace ferry::serve {

struct BlockTable {
  std::vector<std::int32_t> blocks;  // block ids, position p lives in blocks[p / block_tokens]
  // Prefix cache bookkeeping (KvCache's; cleared by release()): the leading blocks that have a
  // content identity, the chained hash through them, and whether a duplicate stopped the chain.
  int identified = 0;
  std::uint64_t chain_hash = 0;
  bool chain_stopped = false;
};

// Counters of the prefix cache (monotone since create()).
struct PrefixCacheCounters {
  std::uint64_t lookups = 0;       // match_prefix() calls
  std::uint64_t query_blocks = 0;  // full blocks those calls could have matched
  std::uint64_t hit_blocks = 0;    // blocks they matched
  std::uint64_t evictions = 0;     // cached blocks whose memory reserve() or resize() took
  std::uint64_t registered = 0;    // blocks given an identity in the map
};

// One block id's bytes across all layers, K and V, for rows of `dtype` (KvCache::block_bytes()
// of a cache of this geometry; the split planners size blocks with it before any cache exists).
std::size_t kv_block_bytes(const model::DecoderGeometry& geo, int block_tokens, DType dtype);

class KvCache {
 public:
  // Sizes the pool from kv.budget_bytes: as many whole blocks as fit (at least one, else
  // resource_exhausted naming the bytes one block needs).
  // shared: the engine's device budget, charged the pool's bytes as well (may be null).
  // tier: where the blocks live; the CPU engine's pool tier (pool_tier.h) by default, kDevice
  // for the CUDA engine (rows are then GPU memory: k_row/v_row give device addresses that only
  // kernels may dereference, and resize() needs set_device_copier()).
  static Result<std::unique_ptr<KvCache>> create(const model::DecoderGeometry& geo,
                                                 const KvConfig& kv,
                                                 mem::MemoryBudget* shared = nullptr,
                                                 std::optional<mem::MemTier> tier = std::nullopt);

  // A pool in GPU memory: resize() moves rows with `te`'s device-to-device copies, enqueued on
  // `stream` (both outlive the cache; the stream must be the one every kernel reading or writing
  // the pool runs on, or the caller orders them). Without it such a pool's resize() is
  // unimplemented. Ignored for pools in host memory (memcpy).
  void set_device_copier(mem::TransferEngine* te, mem::Stream* stream) {
    copy_te_ = te;
    copy_stream_ = stream;
  }
  int block_tokens() const { return block_tokens_; }
  int num_blocks() const { return num_blocks_; }
  int capacity_blocks() const { return capacity_blocks_; }
  // Blocks held by some table (reference count >= 1).
  int used_blocks() const { return num_blocks_ - free_blocks(); }
  std::uint64_t blocks_moved() const { return blocks_moved_; }
  // Blocks reserve() can hand out: free ones plus cached ones (evicted on demand).
  int free_blocks() const { return static_cast<int>(free_.size()) + cached_; }
  // Cached, unreferenced blocks (evictable); 0 without the prefix cache.
  int cached_blocks() const { return cached_; }
  bool prefix_cache() const { return prefix_cache_; }
  const PrefixCacheCounters& prefix_counters() const { return counters_; }
  int ref_count(std::int32_t block) const { return ref_[std::size_t(block)]; }
  int blocks_for(std::int64_t tokens) const {
    return static_cast<int>((tokens + block_tokens_ - 1) / block_tokens_);
  }
  std::size_t block_bytes() const;  // one block id across all layers, K and V
  const mem::MemoryBudget& budget() const { return budget_; }
  DType dtype() const { return dtype_; }
  std::size_t row_bytes() const { return row_bytes_; }
  // The CUDA kernels' view of the pool (kernels/cuda/serve_kernel_args.h's PagedKvLayout): the
  // arena base and the elements between layers; base() as f32 rows (an f32 pool only).
  std::byte* data() const { return base_; }
  float* base() const;
  std::int64_t layer_stride_elems() const {
    return std::int64_t(layer_stride_bytes_ / dtype_size(dtype_));
  }
  mem::MemTier tier() const { return budget_.tier(); }
  // Memory really held for blocks: a resizable pool's committed granules (its whole reservation
  // where the region is backed up front: no VMM, mem/virtual_region.h), else the arena.
  std::size_t held_bytes() const;
  // A resizable pool held whole from creation on (no CUDA VMM, or FERRY_VMM=off).
  bool backed_up_front() const { return resizable() && region_.backed_up_front(); }
  // Address space laid out for blocks (a resizable pool's reservation, else the arena).
  std::size_t reserved_bytes() const;
  bool resizable() const { return !region_.empty(); }

  // Grows `table` to cover `tokens` positions. All or nothing. Takes free blocks first (lowest id
  // first), then evicts cached blocks, least recently released first.
  Status reserve(BlockTable& table, std::int64_t tokens);
  // Drops the table's reference on each of its blocks and clears it; a block nobody references
  // stays cached if it has an identity (prefix cache), else it is free again.
  void release(BlockTable& table);
  // Prefix cache: `table` must be empty. Appends the longest run of cached blocks that holds
  // tokens[0, n * block_tokens) exactly, for n <= (tokens.size() - 1) / block_tokens (the last
  // token is always left to compute), taking a reference on each. Returns n (0 without the
  // prefix cache). The caller computes from position n * block_tokens.
  int match_prefix(BlockTable& table, std::span<const std::int32_t> tokens);
  // The blocks match_prefix would hand a table of `tokens` now, without taking them (no
  // reference, no counters, no observer call): MV-WSA's view of what a waiting request will find
  // cached (Engine::final_blocks). 0 without the prefix cache.
  int cached_prefix_blocks(std::span<const std::int32_t> tokens) const;
  // Prefix cache: gives an identity to every block of `table` whose positions are all below
  // `computed` (their K/V written) and enters it in the map. tokens: the table's token ids (at
  // least `computed` of them). A block whose content is already in the map stays without one
  // (and so do the table's later blocks). No-op without the prefix cache.
  void commit_full_blocks(BlockTable& table, std::span<const std::int32_t> tokens,
                          std::int64_t computed);
  // MV-WSA's view of the prefix cache (wsa/prefix_curve.h): called with lookup = false and one
  // key when a block is released into the cache (a table's blocks tail first), and with
  // lookup = true, the chained hashes of every full block match_prefix could have matched and
  // the blocks other tables referenced then, when the caller reports that admission
  // (report_lookup) -- so a request that waits for blocks and is matched again counts once.
  using PrefixObserver =
      std::function<void(bool lookup, std::span<const std::uint64_t> keys, int pinned)>;
  void set_prefix_observer(PrefixObserver fn) { observer_ = std::move(fn); }
  // `table`: the admitted request's (its blocks are not counted as pinned).
  void report_lookup(const BlockTable& table) {
    if (observer_) {
      observer_(true, last_chain_, used_blocks() - static_cast<int>(table.blocks.size()));
    }
  }
  // Sets the live block count. `tables` must be every table holding blocks (blocks above the new
  // size are moved and the tables rewritten; a block shared by several tables moves once).
  // Cached blocks are dropped, least recently released first, only as far as needed for the
  // referenced and the remaining cached blocks to fit the new size; survivors above it move.
  // invalid_argument: outside [1, capacity] or below the referenced blocks; resource_exhausted:
  // the shared budget cannot take the growth (no change); unimplemented: a pool in GPU memory
  // without set_device_copier(). On the device the row moves are enqueued (see set_device_copier)
  // and complete in stream order; the call returns without waiting.
  Status resize(int blocks, std::span<BlockTable* const> tables);

  // Writes position `pos`'s K and V rows ([G*D] f32 each) in `layer`, rounded to dtype().
  void write_rows(int layer, const BlockTable& table, std::int64_t pos, const float* k,
                  const float* v);
  // The K / V row of position `pos` in `table`, [G*D] elements of dtype(). pos must be covered
  // (a bug otherwise).
  std::byte* k_bytes(int layer, const BlockTable& table, std::int64_t pos) const {
    return row(layer, table, pos, 0);
  }
  std::byte* v_bytes(int layer, const BlockTable& table, std::int64_t pos) const {
    return row(layer, table, pos, 1);
  }
  // The same rows as f32 (a pool of dtype f32 only: a bug otherwise).
  float* k_row(int layer, const BlockTable& table, std::int64_t pos);
  float* v_row(int layer, const BlockTable& table, std::int64_t pos);
  const float* k_row(int layer, const BlockTable& table, std::int64_t pos) const;
  const float* v_row(int layer, const BlockTable& table, std::int64_t pos) const;

 private:
  KvCache(const model::DecoderGeometry& geo, const KvConfig& kv, mem::MemTier tier);
  std::byte* row(int layer, const BlockTable& table, std::int64_t pos, int kv_index) const;
  float* f32_row(int layer, const BlockTable& table, std::int64_t pos, int kv_index) const;
  std::int32_t take_block();            // a free block, else the LRU cached one (evicted)
  void evict(std::int32_t b);           // cached -> free content (not on any list)
  void give_back_free(std::int32_t b);  // onto the free list, keeping it descending
  void lru_push_back(std::int32_t b);   // most recently released end
  void lru_remove(std::int32_t b);
  void lru_replace(std::int32_t from, std::int32_t to);  // `to` takes `from`'s place
  void move_block(std::int32_t from, std::int32_t to);   // identity; rows queued in moves_
  Status copy_moved_rows();                              // moves_' K/V rows, then clears it
  // Resizable pool: backs blocks [0, blocks) of every layer / gives back the granules wholly
  // above block `blocks` in every layer (nothing queued may still touch them).
  Status commit_blocks(int blocks);
  Status decommit_blocks(int blocks);
  std::uint64_t block_hash(std::uint64_t prev, const std::int32_t* tokens) const;
  // The longest verified cached prefix of `tokens` (at most `most` blocks), calling
  // on_block(b) for each matched block in order; returns the chain hash of the last match.
  template <typename OnBlock>
  std::uint64_t walk_cached(std::span<const std::int32_t> tokens, int most,
                            OnBlock&& on_block) const;

  int layers_ = 0;
  int row_elems_ = 0;  // G*D
  DType dtype_ = DType::kF32;
  std::size_t row_bytes_ = 0;  // G*D elements of dtype_
  // One block's K then V rows in one layer (the step between blocks inside a layer).
  std::size_t block_span_bytes() const { return 2 * std::size_t(block_tokens_) * row_bytes_; }
  int block_tokens_ = 0;
  int num_blocks_ = 0;
  int capacity_blocks_ = 0;  // blocks a layer's stride holds
  // Bytes between layers: capacity_blocks_ blocks, rounded up to a granule when resizable.
  std::size_t layer_stride_bytes_ = 0;
  std::uint64_t blocks_moved_ = 0;
  std::vector<std::pair<std::int32_t, std::int32_t>> moves_;  // resize(): (from, to) pending
  mem::TransferEngine* copy_te_ = nullptr;                    // set_device_copier()
  mem::Stream* copy_stream_ = nullptr;
  mem::MemoryBudget budget_;
  BudgetCharge shared_charge_;
  mem::Arena arena_;           // a fixed pool's blocks
  mem::VirtualRegion region_;  // a resizable pool's blocks (KvConfig::max_budget_bytes)
  std::byte* base_ = nullptr;
  std::vector<std::int32_t> free_;  // descending: back() is the lowest free id
  // Per block id, [capacity]: references, content identity (stamp 0: none), the chained hash,
  // the stamp of the block before it in its chain (0 for a first block), and its token ids.
  bool prefix_cache_ = false;
  std::vector<std::int32_t> ref_;
  std::vector<std::uint64_t> stamp_, hash_, parent_stamp_;
  std::vector<std::uint8_t> in_map_;
  std::vector<std::int32_t> tokens_;  // [capacity, block_tokens]
  std::uint64_t next_stamp_ = 1;
  std::unordered_map<std::uint64_t, std::int32_t> map_;  // chained hash -> block
  // LRU list of cached blocks (intrusive, by id): head = least recently released.
  std::vector<std::int32_t> lru_prev_, lru_next_;
  std::int32_t lru_head_ = -1, lru_tail_ = -1;
  int cached_ = 0;
  PrefixCacheCounters counters_;
  PrefixObserver observer_;
  std::vector<std::uint64_t> last_chain_;  // match_prefix's chain, with an observer only
};

}  // namespace ferry::serve
