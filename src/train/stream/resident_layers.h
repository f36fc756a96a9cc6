// SPDX-License-Identifier: Apache-2.0
// ResidentLayers: --resident-layers K. Decoder layers 0..K-1 (the ones the next forward needs
// first) live in the device tier for the whole run: their streaming weights, master (or Kahan
// words), AdamW states (f32 or 8-bit + block scales) and gradients, allocated once from the
// executor's device budget (DevicePlan slot `resident`, sized by bytes()). For those layers the
// executor streams no weights (forward and backward read the views below in place), drains no
// gradients (the backward accumulates into the resident f32 gradients across micro-batches) and
// the CPU worker does no work (LayerOptimizer external units): update() enqueues their AdamW on
// the compute stream with the device tail's kernels (DeviceOptimizerTail::update_unit: the CPU
// worker's arguments, bit for bit) once finish_step knows the clip scale, in place, no copies.
// Per resident layer u, each piece 256-byte aligned:
//   w16     the bf16 streaming weights (bf16 master, or an fp32 master's bf16 copy), the arena's
//           layout of the unit; none with f32 streaming weights (compute reads the master)
//   master  the f32 master or the Kahan words (none with bf16-sr)
//   m, v, m_absmax, v_absmax   the arena's state sections (scales only with 8-bit states)
//   g32     [n] f32 gradients: the backward's target, the running sum over micro-batches (with
//           bf16 gradients rounded to bf16 and back after every micro-batch: the in-memory
//           executor's round_grads_to_bf16, which the norm and the update then read)
//   w32     bf16 streaming weights only: what compute reads as f32, widened from w16 after each
//           update (exact); with bf16 weight views only the f32-read parameters (bf16_widen.h),
//           the GEMMs read w16 in place
// and once, after the layers, bf16 gradients only: g16, [the largest resident layer] bf16, the
// scratch of that rounding (used on the compute stream only, so one serves every layer).
// The host arena keeps these layers' sections but they are stale while training: upload() at
// start / load_from (host -> device), download() where host memory is read (store_to:
// checkpoints, export, the end of the run; release_arena). Tests:
// tests/unit/train/stream_resident_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/result.h"
#include "kernels/backend.h"
#include "mem/stream_set.h"
#include "mem/transfer_engine.h"
#include "train/stream/bf16_widen.h"
#include "train/stream/host_arena.h"
#include "train/stream/layer_optimizer.h"

namespace ferry::train::stream {

inline constexpr int kResidentAllLayers = -1;  // --resident-layers all
inline constexpr int kResidentAuto = -2;       // --resident-layers auto: the most that fit

struct ResidentStats {
  int layers = 0;                    // K
  std::uint64_t updates = 0;         // resident layer updates run (K per applied step)
  std::uint64_t params_updated = 0;  // Backend::hybrid_adamw calls
  std::uint64_t h2d_bytes = 0;       // upload(): host arena -> device
  std::uint64_t d2h_bytes = 0;       // download(): device -> host arena
  std::uint64_t downloads = 0;
};

class ResidentLayers {
 public:
  // K as given (kResidentAllLayers: every layer) -> the count; kResidentAuto stays as it is.
  static int resolve(const ArenaLayout& arena, int k);
  static int resolve(const HostArena& arena, int k) { return resolve(arena.layout(), k); }
  // OK when layers 0..K-1 can be resident: 0 <= K <= L and no parameter of theirs has f32 states
  // beside an f32 master (no device kernel for it, as the device tail).
  static Status check(const HostArena& arena, int k);
  // Device-tier bytes of resident layer u / of layers 0..K-1; views: bf16 weight views apply
  // (DevicePlan::bf16_weight_views): w32 holds only the f32-read parameters. From the arena's
  // layout alone, so ferry plan sizes resident layers with this code before any arena exists.
  static std::size_t layer_bytes(const ArenaLayout& arena, int u, bool views);
  static std::size_t layer_bytes(const HostArena& arena, int u, bool views) {
    return layer_bytes(arena.layout(), u, views);
  }
  // (bytes() = the layers' layer_bytes + scratch_bytes.)
  static std::size_t bytes(const ArenaLayout& arena, int k, bool views);
  static std::size_t bytes(const HostArena& arena, int k, bool views) {
    return bytes(arena.layout(), k, views);
  }
  // The bf16 rounding scratch g16 (bf16 gradients; else 0).
  static std::size_t scratch_bytes(const ArenaLayout& arena, int k);

  // base: bytes(arena, k, views) bytes of the device tier (the caller's). views: the
  // executor's Bf16ViewLanding with bf16 weight views, else null. Nothing is copied yet.
  static Result<std::unique_ptr<ResidentLayers>> create(const HostArena& arena, int k,
                                                        kernels::Backend& backend,
                                                        std::uint8_t* base, std::size_t size,
                                                        const Bf16ViewLanding* views);

  int count() const { return k_; }
  bool resident(int layer) const { return layer < k_; }
  // What compute reads for layer u: f32 weights at p.offset (w32, or the master with f32
  // streaming weights); with views, the f32 part (w32, at Bf16ViewLanding::f32_offset) and the
  // bf16 weights (w16, at p.offset).
  const float* weights_f32(int u) const;
  const std::uint16_t* weights16(int u) const;
  float* grads(int u) const;       // g32 [n]
  std::uint16_t* grads16() const;  // g16, bf16 gradients only (compute stream only)

  // Host arena -> device: every section but the gradients, then w32 widened; enqueued on
  // `stream` and synchronized.
  Status upload(mem::TransferEngine& te, mem::Stream& stream);
  // Device -> host arena: the weights (an f32 streaming copy from the master), master and states,
  // after what `stream` already holds (the updates); synchronized.
  Status download(mem::TransferEngine& te, mem::Stream& stream);
  // The step's update of every resident layer, in place, then w32 refreshed; enqueued on
  // `stream` (the compute stream: the next forward's kernels follow it).
  Status update(const UpdateArgs& a, mem::Stream& stream);
  const ResidentStats& stats() const { return stats_; }

 private:
  enum Piece : std::uint8_t { kW16, kMaster, kM, kV, kMAbs, kVAbs, kG32, kW32, kPieces };
  struct Layout {
    std::size_t at[kPieces] = {};
    std::size_t size[kPieces] = {};
    std::size_t total = 0;
  };
  static Layout layout(const ArenaLayout& arena, int u, bool views);
  ResidentLayers(const HostArena& arena, kernels::Backend& be, const Bf16ViewLanding* views)
      : arena_(arena), be_(be), views_(views) {}
  std::uint8_t* piece(int u, Piece p) const {
    return layouts_[static_cast<std::size_t>(u)].size[p] == 0
               ? nullptr
               : base_[static_cast<std::size_t>(u)] + layouts_[static_cast<std::size_t>(u)].at[p];
  }
  // w32 from w16 on `stream` (bf16 streaming weights only).
  Status widen(int u, mem::Stream& stream);

  const HostArena& arena_;
  kernels::Backend& be_;
  const Bf16ViewLanding* views_;
  int k_ = 0;
  std::vector<Layout> layouts_;      // [K]
  std::vector<std::uint8_t*> base_;  // [K]
  std::uint16_t* g16_ = nullptr;     // the bf16 rounding scratch
  ResidentStats stats_;
};

}  // namespace ferry::train::stream
