// SPDX-License-Identifier: Apache-2.0
// Written as plain scalar code on purpose: the 8 accumulators are independent, so the compiler
// may keep them in one vector register, but it may not reassociate them (no -ffast-math, and the
// build sets -ffp-contract=off), so the bits are those of the source order on every target.
#include "serve/expert_ffn.h"

#include <cmath>

#include "core/check.h"

namespace ferry::serve {

float dot_fixed(const float* a, const float* b, std::int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const std::int64_t body = n / 8 * 8;
  for (std::int64_t i = 0; i < body; i += 8) {
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  }
  float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (std::int64_t i = body; i < n; ++i) r += a[i] * b[i];
  return r;
}

float dot_fixed(const std::uint16_t* a, const float* b, std::int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const std::int64_t body = n / 8 * 8;
  for (std::int64_t i = 0; i < body; i += 8) {
    for (int j = 0; j < 8; ++j) s[j] += bf16_to_f32(a[i + j]) * b[i + j];
  }
  float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (std::int64_t i = body; i < n; ++i) r += bf16_to_f32(a[i]) * b[i];
  return r;
}

namespace {

template <typename W>
void ffn_row(const W* gate, const W* up, const W* down, const float* x, float* out, std::int64_t C,
             std::int64_t F, float* scratch) {
  for (std::int64_t f = 0; f < F; ++f) {
    const float g = dot_fixed(gate + f * C, x, C);
    const float u = dot_fixed(up + f * C, x, C);
    scratch[f] = g / (1.0f + std::exp(-g)) * u;
  }
  for (std::int64_t c = 0; c < C; ++c) out[c] = dot_fixed(down + c * F, scratch, F);
}

}  // namespace

void expert_ffn_row(const ExpertRef& w, const float* x, float* out, std::int64_t C, std::int64_t F,
                    float* scratch) {
  switch (w.dtype) {
    case DType::kF32:
      return ffn_row(static_cast<const float*>(w.gate), static_cast<const float*>(w.up),
                     static_cast<const float*>(w.down), x, out, C, F, scratch);
    case DType::kBF16:
      return ffn_row(static_cast<const std::uint16_t*>(w.gate),
                     static_cast<const std::uint16_t*>(w.up),
                     static_cast<const std::uint16_t*>(w.down), x, out, C, F, scratch);
    default:
      FERRY_CHECK(false, "serve: expert weights in {} (expected f32 or bf16)", to_string(w.dtype));
  }
}

}  // namespace ferry::serve
