// SPDX-License-Identifier: Apache-2.0
// bf16 streaming weights landing in an f32 device buffer. With a bf16 master the arena's weights
// are bf16 and that is what crosses the link (2 bytes/param); compute reads f32, so the copy is
// widened on the device side. Widening is exact (bf16 -> f32 appends zero bits), so compute sees
// the same values wherever it runs — the CPU executor's and the GPU executor's weights are equal.
//   - emulated tier (CPU compute): the bf16 bytes land in the upper half of the f32 buffer and the
//     host widens them in place, front to back. In place is safe sequentially: element k's f32
//     (bytes 4k..4k+3) only overwrites bf16 elements <= k, and element k is read before it is
//     written. No extra memory.
//   - GPU: a parallel kernel cannot widen in place (threads would overwrite bf16 values others
//     still read), so the bytes land in a bf16 staging buffer (planned in the device tier,
//     DevicePlan::stage16) and the backend's convert kernel widens them into the f32 buffer on the
//     copying stream, in stream order: the next copy into the staging buffer on the same stream
//     starts only after the previous widen has read it. Callers never use one staging buffer from
//     two streams at once (stream_executor.cpp: the globals land before the weight thread starts).
// bf16 weight views (GPU, bf16 GEMMs; DevicePlan::bf16_weight_views, Bf16ViewLanding below):
// each weight slot has a bf16 twin with the arena's bf16 layout. A layer's H2D lands there whole
// (no shared staging); its GEMM matrices are then read in place as bf16 views (ModelCompute passes
// them to the bf16 GEMMs without a convert), and only the parameters compute reads as f32 (norm
// weights, biases, q/k norms, the router) are widened, into the slot's f32 part, packed in
// parameter order. Bits: the GEMM sees the bf16 bytes the converting path would have produced
// (bf16 -> f32 -> bf16 is the identity), the f32 parameters the same widened values.
#pragma once

#include <cstdint>
#include <vector>

#include "core/result.h"
#include "kernels/backend.h"
#include "mem/transfer_engine.h"
#include "train/stream/host_arena.h"

namespace ferry::train::stream {

// Where the bf16 copy of n elements lands inside an f32 buffer of n elements (emulated tier).
inline std::uint16_t* bf16_staging(float* dst, std::int64_t n) {
  return reinterpret_cast<std::uint16_t*>(dst) + n;
}

// Widens the n bf16 values at bf16_staging(dst, n) into dst[0..n).
void widen_bf16_in_place(float* dst, std::int64_t n);

class Bf16Landing {
 public:
  // staging: a device buffer of `capacity` bf16 values (GPU backends); ignored on the CPU.
  Bf16Landing(kernels::Backend& be, std::uint16_t* staging, std::int64_t capacity)
      : be_(be), staging_(staging), capacity_(capacity) {}

  // Copies n bf16 values from host `src` into dst[0..n) as f32, on `stream`. On the emulated tier
  // it returns with dst written; on a GPU both the copy and the widen are enqueued on `stream`.
  Status land(float* dst, const std::uint16_t* src, std::int64_t n, mem::TransferEngine& te,
              mem::Stream& stream) const;

 private:
  kernels::Backend& be_;
  std::uint16_t* staging_;
  std::int64_t capacity_;
};

// With bf16 weight views, whether a layer parameter at `offset` elements into its unit is read in
// place as bf16: a GEMM weight (HostArena ParamLoc::gemm_weight) whose bf16 image starts 16-byte
// aligned in the twin. A matrix off that alignment is widened like the small parameters: the
// converting path hands the GEMM a 256-byte aligned w16 scratch, and cuBLASLt picks its algorithm
// by operand alignment (kernels/cuda/gemm_lt.cpp), so an under-aligned view could change the bits.
inline bool bf16_view_param(bool gemm_weight, std::int64_t offset) {
  return gemm_weight && offset % 8 == 0;
}

// The f32 part of a slot with bf16 weight views, per layer: the elements of the parameters that
// are not bf16 views, packed in parameter order. The largest layer's sizes the slot.
// `gemm_weight[k]`, `numel[k]`: the layer's parameters in unit order.
std::int64_t bf16_view_f32_elements(const std::vector<bool>& gemm_weight,
                                    const std::vector<std::int64_t>& numel);

// Lands a layer into a slot with bf16 weight views: one H2D of the layer's bf16 weights into the
// slot's twin, then one widening convert per run of consecutive f32-read parameters into the
// slot's f32 part, both on the copying stream (the slot's reuse is ordered by the weight ring's
// free events as before). GPU backends only (the emulated tier keeps Bf16Landing).
class Bf16ViewLanding {
 public:
  struct Run {
    std::int64_t from = 0;  // elements into the unit's bf16 weights (the twin)
    std::int64_t to = 0;    // elements into the slot's f32 part
    std::int64_t n = 0;
  };
  Bf16ViewLanding(kernels::Backend& be, const HostArena& arena);

  // Where parameter p (HostArena::params() index) of a layer lives in the slot's f32 part, or -1
  // when it is read as a bf16 view of the twin at its arena offset.
  std::int64_t f32_offset(int p) const { return f32_offset_[static_cast<std::size_t>(p)]; }
  // The largest layer's f32 part (the f32 slot's size with views).
  std::int64_t max_f32_elements() const { return max_f32_; }
  // Elements widened per landing of `layer` (tests, counters).
  std::int64_t widened_elements(int layer) const;

  // `src`: the layer's n bf16 weights on the host; `twin` [n] bf16 and `slot` [f32 part] on the
  // device. Enqueued on `stream`.
  Status land(float* slot, std::uint16_t* twin, int layer, const std::uint16_t* src, std::int64_t n,
              mem::TransferEngine& te, mem::Stream& stream) const;
  // Only the widening: the f32-read parameters of `layer` from a device `twin` (the layer's bf16
  // weights, the arena's layout) into `slot`'s f32 part; enqueued on `stream` (GPU-resident
  // layers, resident_layers.h, after their in-place update).
  Status widen(float* slot, const std::uint16_t* twin, int layer, mem::Stream& stream) const;

 private:
  kernels::Backend& be_;
  std::vector<std::int64_t> f32_offset_;  // [param]
  std::vector<std::vector<Run>> runs_;    // [layer]
  std::int64_t max_f32_ = 0;
};

}  // namespace ferry::train::stream
