// SPDX-License-Identifier: Apache-2.0
// Fused AdamW span kernel for every (master weights x optimizer states) combination of the hybrid
// optimizer (docs/optimizer.md, src/train/optim/):
//   master  kF32        f32 master weights p32 (optional round-to-nearest bf16 copy out to p16)
//           kBf16Kahan  bf16 weights p16 + bf16 Kahan compensation comp16
//           kBf16Sr     bf16 weights p16, stochastic rounding with a counter-based random stream
//   states  kF32        f32 m, v
//           kQ8         block-wise 8-bit codes (q8_code.h): m signed, sqrt(v) unsigned, one f32
//                       absmax per kBlock elements and state
// One pass over memory: for each block the old codes are decoded, AdamW runs in f32 as
// simd_adamw.cpp does (same operations in the same order with f32 states; with 8-bit states the
// denominator reuses the stored sqrt(v): sqrt(v) * sqrt(inv_bc2) + eps; the clip factor arrives
// folded into grad_scale, so clipping costs nothing here), the master is updated and the new m
// and sqrt(v) go to an L1-resident scratch row, from which they are encoded with the new block
// absmax.
//
// Variants: AVX-512, AVX2 and the scalar twin (hybrid_adamw_scalar.h), chosen by the caller's Isa
// (cpu_isa.h). All variants perform the same f32 operations in the same order (no FMA) and the
// same integer encodings, so they are bit-identical (hybrid_adamw_test.cpp checks every pair).
// Stochastic rounding draws its bits from hash(key, element index within the parameter), so the
// result depends on neither the thread split nor the ISA.
// Thread-safety: spans over disjoint elements (block-aligned for kQ8) may run concurrently.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/simd_kernels.h"

namespace ferry::kernels::cpu {

enum class MasterKind : std::uint8_t { kF32, kBf16Kahan, kBf16Sr };
enum class StateKind : std::uint8_t { kF32, kQ8 };

// One contiguous span of one parameter. Unused pointers stay null.
struct HybridAdamWSpan {
  std::int64_t n = 0;           // elements in the span
  const float* grad = nullptr;  // [n] f32 (the accumulated gradient; grad_scale folds clip/accum)
  // kF32 master: p32 [n] in/out, p16 [n] optional bf16 copy out.
  // bf16 masters: p16 [n] in/out (the weights), p32 [n] optional f32 copy out (a compute view),
  //               comp16 [n] in/out for kBf16Kahan.
  float* p32 = nullptr;
  std::uint16_t* p16 = nullptr;
  std::uint16_t* comp16 = nullptr;
  // kF32 states: m32, v32 [n]. kQ8 states: m8, v8 [n] codes, m_absmax, v_absmax
  // [ceil(n / q8::kBlock)]; the span must start on a block boundary of its parameter.
  float* m32 = nullptr;
  float* v32 = nullptr;
  std::uint8_t* m8 = nullptr;
  std::uint8_t* v8 = nullptr;
  float* m_absmax = nullptr;
  float* v_absmax = nullptr;
  // kBf16Sr: index of grad[0] within its parameter, and the per-(seed, step, parameter) key.
  std::uint64_t index0 = 0;
  std::uint64_t sr_key = 0;
};

// The random 32 bits that stochastic rounding adds below bf16 precision for element `index`.
// Element indices are taken modulo 2^32 (parameters hold < 2^32 elements).
std::uint32_t sr_random_bits(std::uint64_t sr_key, std::uint64_t index);

// The key for one (seed, AdamW step, parameter number) — SplitMix64 of the three.
std::uint64_t sr_key(std::uint64_t seed, std::int64_t step, std::uint64_t param);

// Runs the update over the span. Checks the pointer set against (master, states) with
// FERRY_CHECK: a mismatch is a bug in the caller.
void hybrid_adamw_span(Isa isa, MasterKind master, StateKind states, const AdamWConstants& k,
                       const HybridAdamWSpan& s);

}  // namespace ferry::kernels::cpu
