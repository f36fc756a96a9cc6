// SPDX-License-Identifier: Apache-2.0
// DeviceOptimizerTail: the device updates the bottom layers in the optimizer phase
// (docs/train_gpu_executor.md item 5, issue #4), on a thread and streams of its own. After the
// backward the CPU LayerOptimizer updates the globals, and the next forward of layer i waits for
// unit i (wait_ready); with --device-update-layers K the layers are one range shared with the CPU
// worker (LayerOptimizer::share_layers): this tail claims from the bottom (0, 1, ..., at most K;
// K = kDeviceUpdateAllLayers: every layer, the meeting point decides), the CPU worker from the top
// (L-1, L-2, ...), each claim atomic, until they meet. submit() hands the tail the step's update
// right after the CPU worker's and returns. Per claimed unit, in one of S staging slots:
//   h2d stream:     wait slot free -> H2D of its optimizer sections (the bf16 weights of a bf16
//                   master, the f32 master or Kahan words, m, v, the 8-bit block scales, the
//                   gradients) into the slot -> event up_done
//   compute stream: wait up_done -> per parameter: bf16 gradients widened to f32 into the one
//                   widening buffer (Backend::convert) and Backend::hybrid_adamw with exactly
//                   LayerOptimizer::update_range's arguments (the same AdamW constants, decay per
//                   parameter, grad_scale = clip / accum, the SR key of (seed, step, parameter),
//                   one span per parameter from element 0: index0 = 0, on a block boundary)
//                   -> event kernels_done
//   d2h stream:     wait kernels_done -> D2H of the updated sections -> event down_done (the slot
//                   is free again)
// and the thread, once down_done completed (host sync), LayerOptimizer::mark_bottom_done(u), which
// wakes WeightStreamer's wait_ready(u) unchanged. The thread claims ahead while a slot is free, so
// up to S units are in flight: unit i+1's H2D runs while unit i's kernels and D2H run (the link is
// full duplex); a unit is marked done only after its own D2H completed. Slot state per unit:
// kFree -> (claim) kLoading (H2D queued) -> kUpdating / kDraining (queued behind events) ->
// (down_done synced, unit marked) kFree; the thread reuses a slot only after that sync, and the
// h2d stream also waits for the slot's down_done (device-side order, not only host order).
// The widening buffer is shared by the slots: it is written and read only on the compute stream,
// whose order serializes the units' kernels.
// The kernels' bits do not depend on how a parameter is split (hybrid_adamw.h), and the CUDA
// kernel is bit-identical to the CPU one (tests/gpu/kernels_optim_test.cpp), so the schedule keeps
// the in-memory executor's bits. On the CPU build the device tier is emulated host memory, the
// streams are host streams (work runs at enqueue) and the CPU backend runs the same kernel:
// stream_executor_tail_test.cpp checks every policy bit for bit for S = 1, 2, 3.
// Units are independent, so whichever side takes a unit the bits are the same (tested with
// delays injected on either side). bf16 gradients on the CPU backend are widened by a plain loop
// on the tail's thread (the CPU backend's convert uses the global pool, which belongs to the
// compute thread). Errors: a failed unit is still marked done (nobody waits forever) once the
// tail's streams are idle (nothing of it still writes the arena), the tail stops claiming (the CPU
// worker takes the rest), the units already in flight finish and are marked, and the error is
// sticky: wait() / error() return it and the executor surfaces it at its next micro_batch /
// finish_step.
// Pre-staging (prestage(), docs/train_gpu_executor.md item 5): during the last micro-batch's
// backward the states of the bottom layers no longer change until their update, so the thread
// copies every section but the gradients of units 0, 1, ... (one per slot, at most K) into slots
// 0, 1, ... on the h2d stream; the claim of a staged unit takes its slot (pick_slot) and uploads
// only its gradients. CUDA stream/event order, all on the tail's streams, all enqueued by the
// tail's thread:
//   h2d:     wait down_done[s] (the slot's previous unit left) -> staged sections of unit s
//            ... (the backward runs; the executor submits) ...
//            wait down_done[s] -> up_start[s] -> gradients of unit s -> up_done[s]
//   compute: wait up_done[s] -> kernels (the staged sections landed before up_done[s]: same stream)
// Staging only reads the arena (the DMA may overlap the CPU worker's update of a unit the CPU then
// claims: that staging is dropped unused) and writes only its slot; the device writes a unit back
// only after claiming it, so a staged unit the CPU claims keeps the CPU's bits. Stagings left
// unused are dropped at the end of each update (the arena moved on).
// Not built yet: keeping a device-updated layer's weights on the device for the forward.
// Thread-safety: submit / wait / error / stats from one thread (the executor's); the tail's
// thread touches only the units it claimed.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/result.h"
#include "core/status.h"
#include "kernels/backend.h"
#include "mem/event.h"
#include "mem/stream_set.h"
#include "mem/transfer_engine.h"
#include "train/stream/host_arena.h"
#include "train/stream/layer_optimizer.h"

namespace ferry::train::stream {

// --device-update-layers all: every layer may go to the device; where the device and the CPU
// worker meet decides the split.
inline constexpr int kDeviceUpdateAllLayers = -1;
// --device-update-layers auto: a plan's tail (ferry train --plan FILE, ferry bench train's
// plan=FILE policies) or the planner's choice (ferry plan, ferry train --plan auto); the
// executor itself never sees it.
inline constexpr int kDeviceUpdateAuto = -2;
inline constexpr int kMaxDeviceUpdateSlots = 8;

// Cumulative since the executor was created.
struct DeviceTailStats {
  int slots = 0;                    // staging slots (units in flight at most)
  std::uint64_t steps = 0;          // updates submitted to the tail (applied steps)
  std::uint64_t units_updated = 0;  // unit updates run on the device (at most K per step)
  std::uint64_t cpu_units = 0;      // layers the CPU worker took in those steps (L - device's)
  std::vector<std::uint64_t> unit_updates;  // [L] device updates per layer
  std::uint64_t params_updated = 0;         // Backend::hybrid_adamw calls
  std::uint64_t h2d_bytes = 0;              // optimizer sections up
  std::uint64_t d2h_bytes = 0;              // updated sections back
  double busy_s = 0.0;  // host wall time from each submit until its claims were over
  // Summed over the updated units (divide by units_updated for a mean): from the start of a
  // unit's H2D to the end of its D2H, and each phase's own time. GPU clock (timing events) on a
  // GPU; host time of the synchronous copies and kernels on the emulated tier. With S > 1 the
  // units overlap, so unit_s sums to more than the tail's wall time.
  double unit_s = 0.0, unit_h2d_s = 0.0, unit_kernel_s = 0.0, unit_d2h_s = 0.0;
  // Pre-staging (prestage()): units whose clip-independent sections went up during the backward,
  // their bytes (counted whether or not the device then claimed the unit), and the units the
  // device claimed with them staged (only their gradients still went up at submit). h2d_bytes
  // counts a used pre-staged unit's sections once, as without pre-staging.
  std::uint64_t prestaged_units = 0, prestaged_bytes = 0, prestage_hits = 0;
};

class DeviceOptimizerTail {
 public:
  // `first` (every call below): the lowest layer the tail may take; layers below it are
  // GPU-resident (resident_layers.h: updated in place, never by the tail or the CPU worker), and
  // the tail's layers are first, first + 1, ..., at most first + K - 1.
  // units as given (kDeviceUpdateAllLayers: every layer from `first`) -> the most layers per
  // update.
  static int resolve_units(const ArenaLayout& arena, int units, int first = 0);
  static int resolve_units(const HostArena& arena, int units, int first = 0) {
    return resolve_units(arena.layout(), units, first);
  }
  // OK when K units can be updated on the device through `slots` staging slots: 0 <= K <=
  // layers - first (after resolve_units), 1 <= slots <= kMaxDeviceUpdateSlots, and no parameter
  // of units first..first+K-1 has f32 states beside an f32 master (no device kernel for that).
  static Status check(const HostArena& arena, int units, int slots, int first = 0);
  // The sizes below read the arena's layout alone (ferry plan sizes the tail with them before any
  // arena exists: cmd_plan_executor_fit.cpp).
  // One staging slot: the largest of units first..first+K-1's sections, each 256-byte aligned.
  static std::size_t slot_bytes(const ArenaLayout& arena, int units, int first = 0);
  // The widening buffer with bf16 gradients: the largest parameter of those units in f32 (one for
  // every slot: it lives on the compute stream); 0 with f32 gradients.
  static std::size_t widen_bytes(const ArenaLayout& arena, int units, int first = 0);
  // Device-tier bytes the tail needs: slots x slot_bytes + widen_bytes; 0 for K = 0.
  static std::size_t staging_bytes(const ArenaLayout& arena, int units, int slots, int first = 0);
  static std::size_t staging_bytes(const HostArena& arena, int units, int slots, int first = 0) {
    return staging_bytes(arena.layout(), units, slots, first);
  }

  // Unit u's optimizer sections somewhere in device memory, each in the arena's layout of that
  // section (HostArena::section): the bf16 weights (a bf16 master, or an fp32 master's bf16
  // streaming copy; null otherwise), the f32 master or the Kahan words, m, v and the 8-bit
  // block scales (null where the mode has none).
  struct UnitSections {
    std::uint8_t* weights = nullptr;
    std::uint8_t* master = nullptr;
    std::uint8_t* m = nullptr;
    std::uint8_t* v = nullptr;
    std::uint8_t* m_absmax = nullptr;
    std::uint8_t* v_absmax = nullptr;
  };
  // Enqueues unit u's AdamW kernels on `stream`: one Backend::hybrid_adamw per parameter with
  // LayerOptimizer::update_range's arguments over the whole parameter (same constants, decay,
  // grad_scale, SR key; index0 = 0), so the bits are the CPU worker's. grads(p) gives parameter
  // p's f32 gradients [p.n] on the device (it may enqueue a widening on `stream`). Adds the calls
  // to *params_updated. Used by the tail (its staging slots) and by ResidentLayers (in place).
  static Status update_unit(const HostArena& arena, kernels::Backend& backend, int u,
                            const UnitSections& at,
                            const std::function<Result<const float*>(const ParamLoc& p)>& grads,
                            const UpdateArgs& a, mem::Stream& stream,
                            std::uint64_t* params_updated);

  // staging: staging_bytes(arena, units, slots) bytes of the device tier (owned by the caller).
  // streams: the tail's own StreamSet (h2d, compute, d2h; outlives the tail). Shares the layers
  // of `opt` with at most `units` (resolved) for the tail. before_unit (tests): called on the
  // tail's thread after each claim; an error fails that unit. Events are created here (Status).
  // before_prestage (tests): called on the tail's thread before each unit's pre-staging; an
  // error stops the pre-staging and is sticky (the tail then claims nothing more).
  static Result<std::unique_ptr<DeviceOptimizerTail>> create(
      HostArena& arena, LayerOptimizer& opt, int units, int slots, kernels::Backend& backend,
      mem::TransferEngine& te, std::uint8_t* staging, std::size_t staging_size,
      mem::StreamSet& streams, std::function<Status(int unit)> before_unit = {},
      std::function<Status(int unit)> before_prestage = {}, int first = 0);
  // Stops after the units in flight (the CPU worker takes any unclaimed units).
  ~DeviceOptimizerTail();
  DeviceOptimizerTail(const DeviceOptimizerTail&) = delete;
  DeviceOptimizerTail& operator=(const DeviceOptimizerTail&) = delete;

  // Asks the tail's thread to copy the clip-independent sections (everything but the gradients)
  // of the layers it claims first — 0, 1, ..., one per staging slot, at most its K — into the
  // slots ahead of the next submit(), and returns. Call it once every unit's previous update is
  // done (the executor: the last micro-batch's backward, after its forward waited for every
  // layer). The thread handles it before a later submit(), and wait() waits for it (its copies
  // queued; done on the emulated tier), so the executor submits the CPU worker's next update only
  // once the staging has read the arena (finish_step waits). A staged unit the device then claims
  // uploads only its gradients; one the CPU worker claims is dropped (only the claimer writes the
  // arena back: staging reads the arena and writes only the slot). Stale stagings are dropped at
  // the end of each update and replaced by the next prestage().
  void prestage();
  // The arena was overwritten (load_from): stagings not yet used are dropped at the next update
  // unless a prestage() comes first.
  void drop_prestaged();
  // Starts claiming units for the update `a` just submitted to `opt` and returns. The previous
  // update must be finished (wait()) before `opt` is submitted again.
  void submit(const UpdateArgs& a);
  // Blocks until the submitted update's claims are over and every prestage() was handled; the
  // first error of any update or pre-staging so far.
  Status wait();
  // The first error so far, without waiting.
  Status error() const;
  int units() const { return units_; }
  int first() const { return first_; }
  int slots() const { return static_cast<int>(slots_.size()); }
  DeviceTailStats stats() const;

 private:
  // One staging slot: where its unit's sections land and the events that order and time it.
  struct Slot {
    std::uint8_t* base = nullptr;
    mem::Event up_start, up_done, kernels_start, kernels_done, down_start, down_done;
    int staged = -1;  // the unit whose clip-independent sections were pre-staged here (-1: none)
  };
  // A claimed unit in a slot, with what it moved and (emulated tier) its phases' host times.
  struct InFlight {
    int unit = -1;
    int slot = -1;
    DeviceTailStats d;  // this unit's counters, merged under the lock once it is done
  };

  DeviceOptimizerTail(HostArena& arena, LayerOptimizer& opt, int units, kernels::Backend& backend,
                      mem::TransferEngine& te, mem::StreamSet& streams,
                      std::function<Status(int)> before_unit);
  void run();
  // Queues the pre-staging of units 0.. into slots 0.. (tail thread; prestage()).
  Status run_prestage();
  // A free slot for unit u: the one holding u's pre-staging, else one without a staging, else
  // any (its staging dropped). free: the free slots; the pick is removed from it.
  int pick_slot(int u, std::vector<int>& free);
  // Whether section s goes up for an update: the weights only with a bf16 master.
  bool uploaded(HostArena::Section s) const {
    return s != HostArena::Section::kWeights || arena_.bf16_master();
  }
  // Queues unit f.unit's copies and kernels in slot f.slot (returns before they ran on a GPU).
  Status enqueue(InFlight& f, const UpdateArgs& a);
  // Waits for the slot's D2H, then reads the phases' times (GPU).
  Status finish(InFlight& f);

  HostArena& arena_;
  LayerOptimizer& opt_;
  int units_ = 0;
  int first_ = 0;  // the lowest layer the tail claims (the GPU-resident layers lie below)
  kernels::Backend& be_;
  mem::TransferEngine& te_;
  std::uint8_t* widen_ = nullptr;  // [largest parameter] f32, bf16 gradients only
  std::vector<Slot> slots_;
  mem::StreamSet& streams_;
  std::function<Status(int)> before_unit_;
  std::function<Status(int)> before_prestage_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  UpdateArgs args_;
  std::uint64_t submitted_ = 0, finished_ = 0;  // updates handed over / whose claims are over
  bool stop_ = false;
  std::uint64_t prestage_asked_ = 0, prestage_done_ = 0;  // prestage() calls / handled
  bool drop_ = false;  // drop_prestaged() since the last prestage()
  Status error_;
  DeviceTailStats stats_;
  std::thread thread_;
};

}  // namespace ferry::train::stream
