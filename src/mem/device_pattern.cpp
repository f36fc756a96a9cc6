// SPDX-License-Identifier: Apache-2.0
// Host reference for fill/verify and the dispatch to the CUDA kernels by stream device.
#include "mem/device_pattern.h"

namespace ferry::mem {

Status fill_pattern(std::byte* dst, std::size_t bytes, std::uint32_t seed, Stream& stream) {
  if (stream.device() == Device::kCuda) return detail::cuda_fill_pattern(dst, bytes, seed, stream);
  for (std::size_t i = 0; i < bytes; ++i) dst[i] = static_cast<std::byte>(pattern_byte(seed, i));
  return {};
}

Status count_pattern_mismatches(const std::byte* src, std::size_t bytes, std::uint32_t seed,
                                std::uint64_t* count, Stream& stream) {
  if (stream.device() == Device::kCuda) {
    return detail::cuda_count_pattern_mismatches(src, bytes, seed, count, stream);
  }
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < bytes; ++i) {
    n += src[i] != static_cast<std::byte>(pattern_byte(seed, i));
  }
  *count = n;
  return {};
}

}  // namespace ferry::mem
