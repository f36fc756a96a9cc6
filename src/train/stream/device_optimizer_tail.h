// SPDX-License-Identifier: Apache-2.0
// DeviceOptimizerTail: the device updates the bottom layers in the optimizer phase
// (docs/train_gpu_executor.md item 5, issue #4), on a thread and a stream of its own. After the
// backward the CPU LayerOptimizer updates the globals, and the next forward of layer i waits for
// unit i (wait_ready); with --device-update-layers K the layers are one range shared with the CPU
// worker (LayerOptimizer::share_layers): this tail claims from the bottom (0, 1, ..., at most K),
// the CPU worker from the top (L-1, L-2, ...), each claim atomic, until they meet. submit() hands
// the tail the step's update right after the CPU worker's and returns; per claimed unit:
//   per unit: H2D of its optimizer sections (the bf16 weights of a bf16 master, the f32 master or
//   Kahan words, m, v, the 8-bit block scales, the gradients) into one staging buffer of the
//   device tier -> bf16 gradients widened to f32 there (Backend::convert) -> per parameter
//   Backend::hybrid_adamw with exactly LayerOptimizer::update_range's arguments (the same AdamW
//   constants, decay per parameter, grad_scale = clip / accum, the SR key of (seed, step,
//   parameter), one span per parameter from element 0: index0 = 0, on a block boundary) -> D2H of
//   the updated sections -> sync of the tail's stream -> LayerOptimizer::mark_bottom_done(u),
//   which wakes WeightStreamer's wait_ready(u) unchanged.
// The kernels' bits do not depend on how a parameter is split (hybrid_adamw.h), and the CUDA
// kernel is bit-identical to the CPU one (tests/gpu/kernels_optim_test.cpp), so the schedule keeps
// the in-memory executor's bits. On the CPU build the device tier is emulated host memory and the
// CPU backend runs the same kernel: stream_executor_tail_test.cpp checks every policy bit for bit.
// Units are independent, so whichever side takes a unit the bits are the same (tested with
// delays injected on either side). bf16 gradients on the CPU backend are widened by a plain loop
// on the tail's thread (the CPU backend's convert uses the global pool, which belongs to the
// compute thread). Errors: a failed unit is still marked done (nobody waits forever), the tail
// stops claiming (the CPU worker takes the rest), and the error is sticky: wait() / error()
// return it and the executor surfaces it at its next micro_batch / finish_step.
// Not built yet: copying the states up during the backward; overlapping unit i's copies with
// unit i+1's kernels (one staging slot, one sync per unit: double-buffering is the next step).
// Thread-safety: submit / wait / error / stats from one thread (the executor's); the tail's
// thread touches only the units it claimed.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"
#include "kernels/backend.h"
#include "mem/transfer_engine.h"
#include "train/stream/host_arena.h"
#include "train/stream/layer_optimizer.h"

namespace ferry::train::stream {

// Cumulative since the executor was created.
struct DeviceTailStats {
  std::uint64_t steps = 0;          // updates submitted to the tail (applied steps)
  std::uint64_t units_updated = 0;  // unit updates run on the device (at most K per step)
  std::uint64_t cpu_units = 0;      // layers the CPU worker took in those steps (L - device's)
  std::vector<std::uint64_t> unit_updates;  // [L] device updates per layer
  std::uint64_t params_updated = 0;         // Backend::hybrid_adamw calls
  std::uint64_t h2d_bytes = 0;              // optimizer sections up
  std::uint64_t d2h_bytes = 0;              // updated sections back
  double busy_s = 0.0;                      // host wall time inside run() (copies, kernels, syncs)
};

class DeviceOptimizerTail {
 public:
  // OK when K units can be updated on the device: 0 <= K <= layers, and no parameter of units
  // 0..K-1 has f32 states beside an f32 master (that combination has no device kernel).
  static Status check(const HostArena& arena, int units);
  // Device-tier bytes the staging buffer needs: the largest of units 0..K-1's sections, each
  // 256-byte aligned, plus an f32 gradient buffer when the arena's gradients are bf16; 0 for K = 0.
  static std::size_t staging_bytes(const HostArena& arena, int units);

  // staging: staging_bytes(arena, units) bytes of the device tier (owned by the caller).
  // stream: the tail's own stream (outlives the tail). Shares the layers of `opt` with at most
  // `units` for the tail. before_unit (tests): called on the tail's thread after each claim; an
  // error fails that unit.
  DeviceOptimizerTail(HostArena& arena, LayerOptimizer& opt, int units, kernels::Backend& backend,
                      mem::TransferEngine& te, std::uint8_t* staging, std::size_t staging_size,
                      mem::Stream& stream, std::function<Status(int unit)> before_unit = {});
  // Stops after the unit in progress (the CPU worker takes any unclaimed units).
  ~DeviceOptimizerTail();
  DeviceOptimizerTail(const DeviceOptimizerTail&) = delete;
  DeviceOptimizerTail& operator=(const DeviceOptimizerTail&) = delete;

  // Starts claiming units for the update `a` just submitted to `opt` and returns. The previous
  // update must be finished (wait()) before `opt` is submitted again.
  void submit(const UpdateArgs& a);
  // Blocks until the submitted update's claims are over; the first error of any update so far.
  Status wait();
  // The first error so far, without waiting.
  Status error() const;
  int units() const { return units_; }
  DeviceTailStats stats() const;

 private:
  void run();
  Status run_unit(int u, const UpdateArgs& a, DeviceTailStats& st);

  HostArena& arena_;
  LayerOptimizer& opt_;
  int units_ = 0;
  kernels::Backend& be_;
  mem::TransferEngine& te_;
  std::uint8_t* staging_ = nullptr;
  std::size_t staging_size_ = 0;
  mem::Stream& stream_;
  std::function<Status(int)> before_unit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  UpdateArgs args_;
  std::uint64_t submitted_ = 0, finished_ = 0;  // updates handed over / whose claims are over
  bool stop_ = false;
  Status error_;
  DeviceTailStats stats_;
  std::thread thread_;
};

}  // namespace ferry::train::stream
