// SPDX-License-Identifier: Apache-2.0
// One parameter's AdamW update for any (master, states) combination, split over the global
// thread pool in whole 8-bit blocks (2048 elements) and run by the hybrid span kernel
// (kernels/cpu/hybrid_adamw.h) with the ISA picked at run time. The clip factor arrives folded
// into k.grad_scale: there is no separate pass over the gradients.
// The split does not change the result (block-aligned; stochastic rounding is keyed by element
// index), so a run is bit-reproducible for any thread count. Tests: hybrid_optimizer_test.cpp.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/simd_kernels.h"
#include "train/optim/optim_state.h"

namespace ferry::train {

struct ParamBuffers {
  std::int64_t n = 0;
  float* master = nullptr;      // [n] f32 master (fp32) or compute view written back (bf16)
  float* m32 = nullptr;         // [n] f32 states only (!st.q8())
  float* v32 = nullptr;         // [n] f32 states only (!st.q8())
  const float* grad = nullptr;  // [n]
};

// The states' kind is the parameter's (st.q8()). sr_key: kernels::cpu::sr_key(seed, AdamW step,
// parameter number) (used by bf16-sr only).
void hybrid_update_param(kernels::cpu::Isa isa, const kernels::cpu::AdamWConstants& k,
                         const OptimMode& mode, ParamOptimState& st, const ParamBuffers& b,
                         std::uint64_t sr_key);

}  // namespace ferry::train
