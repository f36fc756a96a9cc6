// SPDX-License-Identifier: Apache-2.0
// SlotResolver: device-side slot resolution for paged decode (docs/serve.md "Device-side slot
// resolution for paged decode"). The paged executor's alternative to the host pager's acquire
// for a layer call whose routed rows fit the free slots (n = T*K <= cap - hot, so one group),
// under any eviction policy (LRU, LFU, LFRU) with no miss placement rules:
//   resolve   the layer's routed ids -> slots, by ExpertPager's exact victim rule, over
//             the layer's state block and [3, E] pointer table (slot_resolve.h; CUDA: one-block
//             kernel);
//   copy      the misses from the host store into their slots (CUDA: a kernel reading the
//             pinned store through its mapped address; paced like the copy stream when the
//             engine paces the link: one timer mark before, one wait of ceil(bytes / rate) ns
//             after, both on the device since only the device knows the bytes);
//   replay    after the step, each layer's log (its routed ids, misses, counts) is replayed
//             through the host pager in mirror mode (acquire without copies, then release): the
//             pager's counters, slot observer, MV-WSA's access observer and metrics see exactly
//             the host path's sequence, and the log's decisions are checked against the pager's
//             (a difference is an internal error: the twin and kernel are tested equal to it).
// On CUDA all three are stream-ordered on the compute stream with no host wait, so a paged
// decode step has one host sync (the logits read-back, which brings the logs too) and can be a
// CUDA graph. The CPU engine runs the same flow with the twins (resolve_slots_twin,
// copy_misses_twin) over the same arrays on the pool tier, replaying right after each layer.
// State is valid while only this path changed the pager; a host-path acquire (prefill, steps
// over the free slots) or a resize makes a layer stale, and before the next device step its
// state and table are rewritten from the pager (CUDA: one H2D on compute, from a pinned
// mirror). Memory (create): one arena of [moe layers] state blocks, tables and logs (+ the
// pacing mark and LFRU's decay table), on the pool tier, charged to the engine's device budget as
// "device slot resolution"; CUDA adds pinned mirrors of the same size. Not thread-safe (the
// engine's step).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/result.h"
#include "mem/arena.h"
#include "mem/buffer.h"
#include "mem/transfer_engine.h"
#include "model/model_compute.h"
#include "serve/budget_charge.h"
#include "serve/expert_pager.h"
#include "serve/slot_resolve.h"

namespace ferry::serve {

struct SlotResolverDevice {
  mem::TransferEngine* te = nullptr;  // uploads of stale state, the logs' read-back
  double pace_gbps = 0;               // > 0: pace the miss-copy kernel's bytes at this rate
  int copy_blocks = 256;              // the miss-copy kernel's grid
};

class SlotResolver {
 public:
  // dev null: the CPU engine (twins, pool tier). shared: the engine's device budget (may be null).
  static Result<std::unique_ptr<SlotResolver>> create(const model::DecoderGeometry& geo,
                                                      ExpertPager& pager, const ExpertStore& store,
                                                      mem::MemoryBudget* shared,
                                                      const SlotResolverDevice* dev = nullptr);

  // Whether a call of `rows` routed rows naming at most `distinct` different experts of `layer`
  // can be resolved here: the resolver places distinct experts (distinct <= cap - hot: the call's
  // misses fit the slots that are neither hot nor in use) and logs every row (rows <= E).
  bool fits(int layer, std::int64_t rows, std::int64_t distinct) const;
  void mark_stale(int layer) { stale_[std::size_t(layer)] = true; }
  void mark_all_stale() { std::fill(stale_.begin(), stale_.end(), true); }

  // CPU engine: resolve and copy one layer call (ids [n] on the host), then replay it into the
  // pager (observer called first). The layer's table is where its experts now are.
  Status run_cpu(int layer, const std::int32_t* ids, std::int64_t n,
                 const std::function<void(int, std::span<const std::int32_t>)>& observer);
  const void* const* table(int layer) const;

  // CUDA engine, per step: upload stale layers (compute stream, no wait), then per MoE layer
  // enqueue(), then (still inside the step) enqueue_log_readback(); after the step's sync,
  // replay() every MoE layer.
  Status upload_stale(mem::Stream& stream);
  Status enqueue(int layer, const std::int32_t* d_ids, std::int64_t n, mem::Stream& stream);
  // enqueue() in two halves, so work that reads the log (the hits' FFN on another stream) can
  // start between them: the resolve kernel, then the miss copy (and its link pacing).
  Status enqueue_resolve(int layer, const std::int32_t* d_ids, std::int64_t n, mem::Stream& stream);
  Status enqueue_copy(int layer, mem::Stream& stream);
  // The layer's resolve log in device memory (SlotStateLayout), written by enqueue_resolve.
  const std::int32_t* device_log(int layer) const { return log(layer); }
  Status enqueue_log_readback(mem::Stream& stream);
  Status replay(const std::function<void(int, std::span<const std::int32_t>)>& observer);
  // The bytes the last replay() found copied by the device (for the link's counters).
  std::uint64_t last_replay_bytes() const { return last_replay_bytes_; }
  std::size_t bytes() const { return arena_.total_bytes(); }

 private:
  SlotResolver(const model::DecoderGeometry& geo, ExpertPager& pager, const ExpertStore& store,
               mem::MemTier tier);
  std::int32_t* state(int layer) const;  // in the arena
  const void** table_mut(int layer) const;
  std::int32_t* log(int layer) const;
  SlotResolveArgs args(int layer, const std::int32_t* ids, std::int64_t n) const;
  Status fill(int layer, std::int32_t* state, const void** table) const;
  Status replay_layer(int layer, const std::int32_t* log,
                      const std::function<void(int, std::span<const std::int32_t>)>& observer);

  model::DecoderGeometry geo_;
  ExpertPager& pager_;
  const ExpertStore& store_;
  SlotResolverDevice dev_;
  bool on_device_ = false;
  std::vector<int> moe_index_;  // [L] -1 dense
  int moe_layers_ = 0;
  std::int64_t state_ints_ = 0, log_ints_ = 0;
  std::vector<bool> stale_;  // [L]
  mem::MemoryBudget budget_;
  BudgetCharge charge_;
  mem::Arena arena_;
  mem::SlotId s_state_{0}, s_table_{0}, s_log_{0}, s_mark_{0}, s_decay_{0};
  bool decay_uploaded_ = false;  // CUDA: the LFRU decay table (uploaded with the first state)
  mem::MemoryBudget host_budget_{mem::MemTier::kPinnedHost};
  mem::Buffer h_state_, h_table_, h_log_, h_decay_;  // CUDA: pinned mirrors
  std::vector<const unsigned char*> src_base_;  // [L] the layer's expert 0 as the copier reads it
  std::vector<std::int32_t> distinct_;
  std::vector<ExpertRef> refs_;
  std::vector<int> copy_index_;
  std::uint64_t last_replay_bytes_ = 0;
};

}  // namespace ferry::serve
