// SPDX-License-Identifier: Apache-2.0
// Cheap approximately normal values for random benchmark weights: Irwin-Hall(4) from one 64-bit
// random draw. The sum of its four 16-bit quarters (each uniform on 0..65535) has mean 2 * 65535
// and variance 4 * (65536^2 - 1) / 12; centred and scaled, it is bounded at +-3.46 sigma with
// kurtosis 2.4 instead of 3, which random weights for throughput benchmarks do not mind. Why not
// Box-Muller: its log, sqrt and cos cost ~8x more per value (2.3 vs 18 ns, one core), which at
// 7.6e9 (Qwen2.5-7B) or 3.1e10 (Qwen3-30B-A3B) values is minutes of a GPU machine's time.
// Used by the serve and train benches' chunked inits (serve/builtin_model.cpp,
// train/builtin_model.cpp); small models keep their Box-Muller streams.
#pragma once

#include <cstdint>

namespace ferry {

// Variance of the uncentred sum.
inline constexpr double kIrwinHall4Variance = 4 * (65536.0 * 65536.0 - 1) / 12;

// The sum of x's four 16-bit quarters minus its mean (exact in double).
inline double irwin_hall4_centred(std::uint64_t x) {
  constexpr double kMean = 4 * 65535.0 / 2;
  const std::uint32_t sum = static_cast<std::uint32_t>((x & 0xffff) + ((x >> 16) & 0xffff) +
                                                       ((x >> 32) & 0xffff) + (x >> 48));
  return static_cast<double>(sum) - kMean;
}

}  // namespace ferry
