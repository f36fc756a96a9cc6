// SPDX-License-Identifier: Apache-2.0
// Span kernels behind the CPU backend's hot ops, one entry point per op that dispatches on an Isa
// (cpu_isa.h) to an AVX-512 body, an AVX2 body or the scalar function (which also does every
// SIMD body's tail). All pointers are f32 host memory, contiguous, unaligned allowed.
//
// Determinism: every variant performs the same f32 operations in the same order (no FMA
// contraction; reductions use 16 fixed lanes, element i in lane i % 16, combined by the same
// halving tree), so all variants return bit-identical results. simd_kernels_test.cpp checks it.
// The exp inside silu is our own range-reduced polynomial (about 2 ulp on [-87, 88]; inputs are
// clamped to that range, so silu(g) for g < -87 is off by less than 1e-36 in absolute terms).
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_isa.h"

namespace ferry::kernels::cpu {

// One row: out = in * rstd * w with rstd = 1 / sqrt(sum(in^2) / c + eps); returns rstd.
float rms_norm_row(Isa isa, float* out, const float* in, const float* w, std::int64_t c, float eps);

// One row of the input gradient (the weight gradient is reduced over rows by the caller):
//   d_in = rstd * w * dy - x * (rstd^3 / c * sum(dy * w * x))
void rms_norm_backward_row(Isa isa, float* d_in, const float* dy, const float* x, const float* w,
                           float rstd, std::int64_t c);

// out = silu(g) * u.
void swiglu_span(Isa isa, float* out, const float* g, const float* u, std::int64_t n);
// d_up = dy * silu(g);  d_gate = dy * u * sig(g) * (1 + g * (1 - sig(g))).
void swiglu_backward_span(Isa isa, float* d_gate, float* d_up, const float* dy, const float* g,
                          const float* u, std::int64_t n);

// Per-step constants of AdamW (ops.h), with the bias corrections folded in once per call.
struct AdamWConstants {
  float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, grad_scale;
  float inv_bc1;  // 1 / (1 - beta1^step)
  float inv_bc2;  // 1 / (1 - beta2^step)
};
AdamWConstants make_adamw_constants(float lr, float beta1, float beta2, float eps,
                                    float weight_decay, float grad_scale, std::int64_t step);
// The step over n elements; p_bf16 (may be null) receives round-to-nearest-even bf16 of p.
//   g = grad * gs; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g;
//   p = p - lr * ((m * inv_bc1) / (sqrt(v * inv_bc2) + eps) + wd * p)
void adamw_span(Isa isa, const AdamWConstants& k, float* p, float* m, float* v,
                std::uint16_t* p_bf16, const float* grad, std::int64_t n);

}  // namespace ferry::kernels::cpu
