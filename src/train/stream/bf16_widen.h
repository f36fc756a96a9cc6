// SPDX-License-Identifier: Apache-2.0
// bf16 streaming weights on the emulated device tier. With a bf16 master the arena's weights are
// bf16 and that is what crosses to the device (2 bytes/param); the CPU kernels read f32, so the
// device buffer (sized for f32) receives the bf16 bytes in its upper half and is widened in place,
// front to back — what a GPU kernel would do while reading bf16 from the slot. Widening is exact
// (bf16 -> f32 appends zero bits), so compute sees the same values as the in-memory executor's
// f32 view of the bf16 weights.
// In place is safe: element k's f32 (bytes 4k..4k+3) only overwrites bf16 elements <= k, and
// element k is read before it is written.
#pragma once

#include <cstdint>

namespace ferry::train::stream {

// Where the bf16 copy of n elements lands inside an f32 buffer of n elements.
inline std::uint16_t* bf16_staging(float* dst, std::int64_t n) {
  return reinterpret_cast<std::uint16_t*>(dst) + n;
}

// Widens the n bf16 values at bf16_staging(dst, n) into dst[0..n).
void widen_bf16_in_place(float* dst, std::int64_t n);

}  // namespace ferry::train::stream
