// SPDX-License-Identifier: Apache-2.0
// A tiny deterministic random generator (SplitMix64) whose whole state is one uint64, so a
// checkpoint can store it and a resumed run draws exactly the same numbers. std::mt19937 +
// std::normal_distribution would tie results to one standard library's distribution code.
// Used for weight init and data shuffling. Tests: tests/unit/train/data_test.cpp (determinism).
#pragma once

#include <cmath>
#include <cstdint>

namespace ferry::train {

struct Rng {
  std::uint64_t state = 0;

  explicit Rng(std::uint64_t seed = 0) : state(seed) {}

  std::uint64_t next_u64() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0 (modulo bias is < n / 2^64: irrelevant here).
  std::uint64_t below(std::uint64_t n) { return next_u64() % n; }
  // Standard normal (Box-Muller; one value per call, the second is discarded for simplicity).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

// Mixes two values into one seed (for per-epoch / per-purpose streams).
inline std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b) {
  Rng r(a ^ (b * 0xD6E8FEB86659FD93ull));
  return r.next_u64();
}

}  // namespace ferry::train
