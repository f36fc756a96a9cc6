// SPDX-License-Identifier: Apache-2.0
// The routed expert's arithmetic, one token at a time:
//   out[C] = down[C, F] · (silu(gate[F, C] · x) * (up[F, C] · x))
// Every dot product runs in one fixed order (dot_fixed: 8 interleaved partial sums over index
// i mod 8, combined pairwise, then the tail in order), with no dependence on the pointers'
// alignment, the number of tokens computed together, or which slot the weights sit in. That is
// what lets every expert mode (resident, static, cpu-experts, paged at any cap) produce the same
// bits: only the weight pointer moves, never the arithmetic. The combine (backend moe_combine, an
// fma chain in routing order) is likewise independent of where the rows came from.
// Slow twin: an f64 loop in tests/unit/serve/expert_ffn_test.cpp (tolerance), plus a bitwise
// check that a misaligned copy of the weights gives the same bits.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace ferry::serve {

// One expert's weights, wherever they live. Row-major, all three in `dtype`: kF32, or kBF16
// (raw bf16 bits; the arithmetic stays f32: each weight is widened exactly, products and sums
// are f32 in the same fixed order).
struct ExpertRef {
  const void* gate = nullptr;  // [F, C]
  const void* up = nullptr;    // [F, C]
  const void* down = nullptr;  // [C, F]
  DType dtype = DType::kF32;
};

float dot_fixed(const float* a, const float* b, std::int64_t n);
// dot_fixed's order with `a` in bf16 bits.
float dot_fixed(const std::uint16_t* a, const float* b, std::int64_t n);

// scratch: [F] floats owned by the caller (one per thread). w.dtype must be kF32 or kBF16.
void expert_ffn_row(const ExpertRef& w, const float* x, float* out, std::int64_t C, std::int64_t F,
                    float* scratch);

}  // namespace ferry::serve
