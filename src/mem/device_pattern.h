// SPDX-License-Identifier: Apache-2.0
// Fill and verify memory with pattern_byte(seed, i) on the stream's device: a host loop on host
// streams (any host-addressable memory, including the CPU build's emulated device tier), a CUDA
// kernel (cuda/device_pattern.cu) on CUDA streams. Used by the device-tier and transfer-engine
// GPU tests and as a cheap end-to-end check of a staging pipeline.
//
//   FERRY_TRY(fill_pattern(d_buf, n, 42, ss.compute()));
//   FERRY_TRY(count_pattern_mismatches(d_buf, n, 42, d_count, ss.compute()));
//   ... copy *d_count to the host after the stream completes ...
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "mem/pattern_byte.h"
#include "mem/stream.h"

namespace ferry::mem {

// dst[i] = pattern_byte(seed, i) for i in [0, bytes). Enqueued on `stream`.
Status fill_pattern(std::byte* dst, std::size_t bytes, std::uint32_t seed, Stream& stream);

// *count = number of i in [0, bytes) with src[i] != pattern_byte(seed, i). `count` lives where the
// stream's device can write it (device memory for CUDA streams) and is valid once the stream's
// work up to this call has completed.
Status count_pattern_mismatches(const std::byte* src, std::size_t bytes, std::uint32_t seed,
                                std::uint64_t* count, Stream& stream);

namespace detail {
// CUDA launchers (device_pattern_cuda.cpp; unavailable in CPU builds).
Status cuda_fill_pattern(std::byte* d_dst, std::size_t bytes, std::uint32_t seed, Stream& stream);
Status cuda_count_pattern_mismatches(const std::byte* d_src, std::size_t bytes, std::uint32_t seed,
                                     std::uint64_t* d_count, Stream& stream);
}  // namespace detail

}  // namespace ferry::mem
