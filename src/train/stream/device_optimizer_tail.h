// SPDX-License-Identifier: Apache-2.0
// DeviceOptimizerTail: the device updates the bottom K layers in the optimizer phase
// (docs/train_gpu_executor.md item 5, issue #4). After the backward the CPU LayerOptimizer
// updates the globals, then layers 0..L-1, and the next forward of layer i waits for unit i; with
// --device-update-layers K the CPU worker skips units 0..K-1 (LayerOptimizer::set_external) and
// this tail updates them on the device instead, in order, once finish_step knows the clip factor:
//   per unit: H2D of its optimizer sections (the bf16 weights of a bf16 master, the f32 master or
//   Kahan words, m, v, the 8-bit block scales, the gradients) into one staging buffer of the
//   device tier -> bf16 gradients widened to f32 there (Backend::convert) -> per parameter
//   Backend::hybrid_adamw with exactly LayerOptimizer::update_range's arguments (the same AdamW
//   constants, decay per parameter, grad_scale = clip / accum, the SR key of (seed, step,
//   parameter), one span per parameter from element 0: index0 = 0, on a block boundary) -> D2H of
//   the updated sections -> sync -> LayerOptimizer::mark_external_done(u), which wakes
//   WeightStreamer's wait_ready(u) unchanged.
// The kernels' bits do not depend on how a parameter is split (hybrid_adamw.h), and the CUDA
// kernel is bit-identical to the CPU one (tests/gpu/kernels_optim_test.cpp), so the schedule keeps
// the in-memory executor's bits. On the CPU build the device tier is emulated host memory and the
// CPU backend runs the same kernel: stream_executor_tail_test.cpp checks every policy bit for bit.
// Not built yet: the top-down meeting point with the CPU (K is fixed), copying the states up
// during the backward, overlapping unit i's copies with unit i+1's kernels (run() syncs per unit).
// Thread-safety: run() from the executor's thread; it touches only units 0..K-1, which the CPU
// worker skips, beside the worker's updates of the others.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "kernels/backend.h"
#include "mem/transfer_engine.h"
#include "train/stream/host_arena.h"
#include "train/stream/layer_optimizer.h"

namespace ferry::train::stream {

// Cumulative since the executor was created.
struct DeviceTailStats {
  std::uint64_t units_updated = 0;   // unit updates run on the device (K per applied step)
  std::uint64_t params_updated = 0;  // Backend::hybrid_adamw calls
  std::uint64_t h2d_bytes = 0;       // optimizer sections up
  std::uint64_t d2h_bytes = 0;       // updated sections back
  double busy_s = 0.0;               // host wall time inside run() (copies, kernels, syncs)
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
  // Marks units 0..units-1 external on `opt`.
  DeviceOptimizerTail(HostArena& arena, LayerOptimizer& opt, int units, kernels::Backend& backend,
                      mem::TransferEngine& te, std::uint8_t* staging, std::size_t staging_size);

  // Updates units 0..K-1 in order on `stream` with the update `a` just submitted to the CPU
  // worker; returns when all are back in the arena and marked done. On an error the remaining
  // units are marked done too (nobody would wake a waiter otherwise) and their arena state is
  // not updated: the step failed and the run must stop.
  Status run(const UpdateArgs& a, mem::Stream& stream);
  int units() const { return units_; }
  const DeviceTailStats& stats() const { return stats_; }

 private:
  Status run_unit(int u, const UpdateArgs& a, mem::Stream& stream);

  HostArena& arena_;
  LayerOptimizer& opt_;
  int units_ = 0;
  kernels::Backend& be_;
  mem::TransferEngine& te_;
  std::uint8_t* staging_ = nullptr;
  std::size_t staging_size_ = 0;
  DeviceTailStats stats_;
};

}  // namespace ferry::train::stream
