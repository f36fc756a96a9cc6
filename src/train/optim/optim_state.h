// SPDX-License-Identifier: Apache-2.0
// What the hybrid optimizer keeps per parameter beyond TrainState's f32 buffers (master / compute
// weights, gradients, and f32 m, v when the states are fp32):
//   bf16 masters:  w16 [n] the weights (the truth; TrainState::master holds their f32 value,
//                  the compute view), comp16 [n] the Kahan compensation (bf16-kahan only)
//   8-bit states:  m8, v8 [n] codes and m_absmax, v_absmax [ceil(n / 2048)] (q8_code.h), for
//                  the parameters selected by --8bit-params (q8(); default all); the others
//                  keep f32 m, v in TrainState
// Fresh states are zero (all codes 0, absmax 0), like f32 AdamW's. Ownership: TrainState owns one
// HybridOptimState. Tests: hybrid_optimizer_test.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_binding.h"
#include "train/optim/optim_modes.h"

namespace ferry::train {

struct ParamOptimState {
  std::vector<std::uint16_t> w16;         // [n] bf16 weights (bf16 masters)
  std::vector<std::uint16_t> comp16;      // [n] Kahan compensation (bf16-kahan)
  std::vector<std::uint8_t> m8;           // [n] signed E4M3 codes of m (8bit)
  std::vector<std::uint8_t> v8;           // [n] E4M4 codes of sqrt(v) (8bit)
  std::vector<float> m_absmax, v_absmax;  // [ceil(n / kBlock)] (8bit)
  // This parameter keeps 8-bit states (else f32 m, v): told by its storage, which create()
  // sizes from the selection (every parameter has n >= 1, hence >= 1 block).
  bool q8() const { return !m_absmax.empty(); }
};

struct HybridOptimState {
  OptimMode mode;
  std::uint64_t sr_seed = 0;            // stochastic rounding stream (the run's --seed)
  std::vector<ParamOptimState> params;  // same order as TrainState::master->named

  // Sizes everything for `mode`. With a bf16 master the weights become round-to-nearest bf16 of
  // `master`, and `master` is overwritten with their f32 value so compute sees the bf16 weights.
  // q8[i]: parameter i keeps 8-bit states (8bit mode only; empty = every parameter).
  static HybridOptimState create(const OptimMode& mode, std::uint64_t sr_seed,
                                 model::GradStorage& master, const std::vector<bool>& q8 = {});

  // Whether any parameter keeps f32 m, v (TrainState then allocates them).
  bool any_f32_states() const;

  // Re-derives master (the f32 compute view) from w16 after a checkpoint load (bf16 masters).
  void refresh_compute_view(model::GradStorage& master) const;
};

// Number of 8-bit blocks of an n-element parameter.
std::int64_t q8_blocks(std::int64_t n);

}  // namespace ferry::train
