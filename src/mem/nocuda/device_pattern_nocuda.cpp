// SPDX-License-Identifier: Apache-2.0
#include "mem/device_pattern.h"

namespace ferry::mem::detail {

Status cuda_fill_pattern(std::byte*, std::size_t, std::uint32_t, Stream&) {
  return unavailable("mem: fill_pattern on a CUDA stream: built without CUDA");
}

Status cuda_count_pattern_mismatches(const std::byte*, std::size_t, std::uint32_t, std::uint64_t*,
                                     Stream&) {
  return unavailable("mem: count_pattern_mismatches on a CUDA stream: built without CUDA");
}

}  // namespace ferry::mem::detail
