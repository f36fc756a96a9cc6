// SPDX-License-Identifier: Apache-2.0
// LayerOptimizer: the streaming executor's AdamW, off the critical path. submit() hands one
// step's update to a CPU worker thread, which updates the units in the order the next forward
// needs them — the embedding, then layers 0..L-1 — and after each unit publishes a per-unit ready
// generation. wait_ready(u) blocks only until unit u is done, so the next step's forward of layer
// i waits for layer i's update alone.
// The globals are two ready points (docs/train_gpu_executor.md, "the globals split"): the arena's
// globals unit G holds the embedding first (param_specs order), then the final norm and the
// untied lm_head; wait_ready(G) covers the embedding, wait_ready(head_unit()) the final norm +
// lm_head (tied embeddings: the final norm alone), which the forward reads only at its end. Where
// the head goes in the worker's order is HeadUpdate: kEarly right after the embedding (before the
// layers), kLate after the worker's last layer. Parameters are independent and the SR key is per
// parameter, so the order never changes the bits.
//
// Per parameter the update is exactly the in-memory executor's (optimizer.h): the fused AdamW
// span kernel (fp32/fp32) or the hybrid kernel (8-bit states or bf16 masters), grad_scale =
// clip / accum folded in, weight decay where ParamLoc::decay says; then an fp32 master is copied
// into the unit's streaming weights (bf16 masters are updated in place: the streaming copy). The
// worker calls the span kernels on its own thread and, with threads > 1, on a pool of its own (the
// global ThreadPool is single-caller and belongs to the compute thread): each parameter is cut
// into chunks of kChunk elements (whole 8-bit blocks) and the fp32 master's streaming copy is
// written chunk by chunk while it is in cache. The kernels' results do not depend on how a
// parameter is split, so the bits equal the reference's for any thread count (tested).
// External units (set_external): units another updater takes (the device optimizer tail,
// device_optimizer_tail.h). The worker skips them at submit but they keep their ready
// generation: wait_ready(u) returns once that updater called mark_external_done(u) for the
// newest submitted update, so WeightStreamer's wait is unchanged.
// Shared layers (share_layers, the device tail's meeting point): layers 0..L-1 form one range
// claimed from both ends per update, each claim atomic under the lock — the worker after the
// embedding (and the head with kEarly) from the top (L-1, L-2, ...), the other updater through
// claim_bottom() from the bottom (0, 1, ..., at most `bottom_max` of them) — until they meet. Every
// layer is claimed exactly once per update whatever the timing; the units are independent, so any
// split gives the same bits. Thread-safety: submit / wait_* / mark_external_done from one thread
// (the executor's); claim_bottom / mark_bottom_done from the other updater's thread, only between a
// submit() and that update's last unit being ready (the caller orders its next submit() after
// them). The worker owns the arena's master, states and weights of a unit it claimed (or a
// non-external one) between submit() and that unit's ready generation.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "core/result.h"
#include "core/thread_pool.h"
#include "train/stream/host_arena.h"

namespace ferry::train::stream {

struct UpdateArgs {
  float lr = 0.0f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
  float grad_scale = 1.0f;
  std::int64_t step = 1;  // 1-based AdamW step
  std::uint64_t sr_seed = 0;
};

// Where the final norm + lm_head update goes in the CPU worker's order.
enum class HeadUpdate : std::uint8_t {
  kEarly,  // embedding, head, then the layers (0..L-1, or from the top with a device tail)
  kLate,   // embedding, the layers, then the head
};

// --head-update: "early" | "late".
inline Result<HeadUpdate> parse_head_update(std::string_view s) {
  if (s == "early") return HeadUpdate::kEarly;
  if (s == "late") return HeadUpdate::kLate;
  return invalid_argument("train: --head-update {} is not early or late", s);
}

class LayerOptimizer {
 public:
  // before_unit (tests): called on the worker before each unit's update (the head part of the
  // globals as head_unit()). threads: CPU threads updating a unit (1: the worker alone).
  explicit LayerOptimizer(HostArena& arena, int threads = 1,
                          std::function<void(int unit)> before_unit = {},
                          HeadUpdate head = HeadUpdate::kEarly);
  static constexpr std::int64_t kChunk = std::int64_t{1} << 16;  // 32 blocks of 2048
  ~LayerOptimizer();
  LayerOptimizer(const LayerOptimizer&) = delete;
  LayerOptimizer& operator=(const LayerOptimizer&) = delete;

  // Starts the update of every unit (waits for a previous one to finish first).
  void submit(const UpdateArgs& args);
  // unit: a layer, the globals unit (its embedding) or head_unit() (final norm + lm_head).
  void wait_ready(int unit);
  // The pseudo-unit of the globals' head part: arena.num_units() (not an arena unit).
  int head_unit() const { return arena_.num_units(); }
  // Elements of the globals unit that belong to the embedding (the head part follows them).
  std::int64_t embed_elements() const { return embed_elements_; }
  // Units the worker skips from now on (before the first submit, or between steps once
  // wait_all() returned); their updater calls mark_external_done(u) after each submit().
  void set_external(const std::vector<int>& units);
  bool is_external(int unit) const { return external_[static_cast<std::size_t>(unit)]; }
  // External unit `unit` holds the newest submitted update (wakes wait_ready).
  void mark_external_done(int unit);
  // Layers first..L-1 shared with a bottom-up updater from now on (before the first submit, or
  // between steps once wait_all() returned); bottom_max: the most it may claim per update.
  // Layers below `first` must be external (GPU-resident layers: resident_layers.h).
  void share_layers(int bottom_max, int first = 0);
  // The lowest unclaimed layer of the newest update, claimed; -1 once the two ends met or
  // bottom_max were claimed.
  int claim_bottom();
  // A layer claim_bottom() returned holds the newest update (wakes wait_ready).
  void mark_bottom_done(int unit);
  void wait_all();
  bool is_ready(int unit) const;  // no update of `unit` pending
  // Seconds the worker spent updating (cumulative).
  double busy_s() const;
  // The same per unit (index = arena unit: layers 0..L-1, then the globals: embedding + head):
  // what `ferry plan` takes as each layer's update time instead of splitting the total by weight.
  std::vector<double> unit_busy_s() const;
  // The globals' entry of unit_busy_s() split: {embedding, final norm + lm_head}.
  std::array<double, 2> globals_busy_s() const;

 private:
  void run();
  // The worker's claim in a shared range for update `gen`: the highest unclaimed layer, or -1
  // (met, or a newer update was submitted while the worker was between its last unit and this).
  int claim_top(std::uint64_t gen);
  void update_unit(int u, const UpdateArgs& a);
  int arena_unit(int u) const { return u == head_unit() ? arena_.globals_unit() : u; }
  // Elements [begin, end) of parameter idx (begin on a kChunk boundary).
  void update_range(int u, int idx, const UpdateArgs& a, std::int64_t begin, std::int64_t end);

  HostArena& arena_;
  std::function<void(int)> before_unit_;
  std::int64_t embed_elements_ = 0;
  HeadUpdate head_;
  std::vector<int> order_;      // embedding, head and layers, in the worker's unshared order
  std::vector<bool> external_;  // [unit]: updated by someone else (set_external)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t submitted_ = 0;      // generation of the newest submitted update
  std::vector<std::uint64_t> done_;  // [unit + head]: newest generation applied
  UpdateArgs args_;
  bool stop_ = false;
  bool shared_ = false;              // share_layers() called
  int bottom_max_ = 0;               // the bottom-up updater's most units per update
  int shared_first_ = 0;             // the shared range's lowest layer
  int bottom_ = 0, top_ = 0;         // unclaimed layers of the newest update: [bottom_, top_)
  std::vector<double> unit_busy_s_;  // [unit + head] seconds updating it (busy_s(): their sum)
  struct Chunk {
    int idx;             // parameter
    std::int64_t begin;  // first element
  };
  std::vector<std::vector<Chunk>> chunks_;  // [unit + head], fixed at construction
  std::unique_ptr<ThreadPool> pool_;        // threads > 1
  std::thread worker_;
};

}  // namespace ferry::train::stream
