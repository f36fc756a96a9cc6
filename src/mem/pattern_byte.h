// SPDX-License-Identifier: Apache-2.0
// The byte pattern used to fill and verify memory in tests and self-checks: byte i of a buffer
// filled with `seed` is pattern_byte(seed, i). Shared verbatim by host code and the CUDA kernels
// in cuda/device_pattern.cu (no includes beyond <cstdint> and core/host_device.h, so nvcc and g++
// both compile it).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace ferry::mem {

// A 64-bit mix (splitmix64 finalizer) of seed and index, truncated to one byte: neighbouring
// bytes and neighbouring seeds differ, so misplaced or stale copies are detected.
FERRY_HOST_DEVICE inline std::uint8_t pattern_byte(std::uint32_t seed, std::uint64_t i) {
  std::uint64_t z = i + (static_cast<std::uint64_t>(seed) << 32) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<std::uint8_t>(z ^ (z >> 31));
}

}  // namespace ferry::mem
