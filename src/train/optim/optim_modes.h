// SPDX-License-Identifier: Apache-2.0
// The hybrid optimizer's two choices (docs/optimizer.md) and what they cost in host memory:
//   master weights:   fp32         f32 master + a bf16 streaming copy
//                     bf16-kahan   bf16 weights (also the streaming copy) + bf16 Kahan compensation
//                     bf16-sr      bf16 weights, stochastic rounding (seeded, counter-based)
//   optimizer states: fp32         f32 m and v
//                     8bit         block-wise 8-bit m and sqrt(v) + an f32 absmax per 2048
// host_bytes_per_param() is the arena layout of train.md item 1 per parameter (weights, master,
// states, gradient landing buffer); `ferry train` prints it at start and the planner / budget
// check call it. Pure functions, thread-safe. Tests: tests/unit/train/optim_modes_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/result.h"

namespace ferry::train {

enum class MasterWeights : std::uint8_t { kF32, kBf16Kahan, kBf16Sr };
enum class OptimizerStates : std::uint8_t { kF32, k8Bit };

struct OptimMode {
  MasterWeights master = MasterWeights::kF32;
  OptimizerStates states = OptimizerStates::kF32;
  bool operator==(const OptimMode&) const = default;
};

std::string_view to_string(MasterWeights m);    // "fp32", "bf16-kahan", "bf16-sr"
std::string_view to_string(OptimizerStates s);  // "fp32", "8bit"
Result<MasterWeights> parse_master_weights(std::string_view name);
Result<OptimizerStates> parse_optimizer_states(std::string_view name);
std::string describe(const OptimMode& m);  // "master=bf16-kahan states=8bit"

struct HostBytesPerParam {
  double weights = 0.0;  // bf16 streaming copy (bf16 masters: the weights themselves)
  double master = 0.0;   // f32 master (4), Kahan compensation (2) or nothing (stochastic rounding)
  double states = 0.0;   // m + v, including the 8-bit block scales
  double grads = 0.0;    // gradient landing buffer
  double total() const { return weights + master + states + grads; }
};

// Host bytes per parameter of the streaming arena for one combination. grad_dtype: what the GPU
// hands back (bf16 in the streaming design, f32 in the in-memory CPU executor).
HostBytesPerParam host_bytes_per_param(const OptimMode& m, DType grad_dtype = DType::kBF16);

// The same with 8-bit states on a fraction of the elements only (--8bit-params) and fp32 states
// on the rest: states = f * 8-bit + (1 - f) * fp32. m.states must be 8bit; f in [0, 1].
HostBytesPerParam mixed_host_bytes_per_param(const OptimMode& m, double q8_fraction,
                                             DType grad_dtype = DType::kBF16);

// The optimizer's own share (master + states), the part these options change.
double optimizer_state_bytes_per_param(const OptimMode& m);

// One line per combination (all six), for --help-like listings and logs.
std::string bytes_per_param_table(DType grad_dtype = DType::kBF16);

}  // namespace ferry::train
