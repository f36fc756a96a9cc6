// SPDX-License-Identifier: Apache-2.0
// Status wrappers around the pattern kernels; FERRY_DEBUG_SYNC=1 synchronizes after each launch.
#include <cuda_runtime.h>

#include <cstdlib>

#include "core/check.h"
#include "mem/cuda/cuda_util.h"
#include "mem/cuda/device_pattern.cuh"
#include "mem/device_pattern.h"

namespace ferry::mem::detail {

namespace {
bool debug_sync() {
  static const bool on = [] {
    const char* v = std::getenv("FERRY_DEBUG_SYNC");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

Status after_launch(cudaError_t e, const char* what, Stream& stream) {
  if (e != cudaSuccess) return cuda_status(e, what, __FILE__, __LINE__);
  if (debug_sync()) {
    FERRY_CUDA_TRY(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.native())));
  }
  return {};
}
}  // namespace

Status cuda_fill_pattern(std::byte* d_dst, std::size_t bytes, std::uint32_t seed, Stream& stream) {
  ScopedDevice guard(stream.device_index());
  FERRY_CUDA_TRY(guard.status());
  return after_launch(cuda::launch_fill_pattern(reinterpret_cast<std::uint8_t*>(d_dst), bytes, seed,
                                                static_cast<cudaStream_t>(stream.native())),
                      "launch_fill_pattern", stream);
}

Status cuda_count_pattern_mismatches(const std::byte* d_src, std::size_t bytes, std::uint32_t seed,
                                     std::uint64_t* d_count, Stream& stream) {
  static_assert(sizeof(std::uint64_t) == sizeof(unsigned long long));
  ScopedDevice guard(stream.device_index());
  FERRY_CUDA_TRY(guard.status());
  return after_launch(
      cuda::launch_count_pattern_mismatches(reinterpret_cast<const std::uint8_t*>(d_src), bytes,
                                            seed, reinterpret_cast<unsigned long long*>(d_count),
                                            static_cast<cudaStream_t>(stream.native())),
      "launch_count_pattern_mismatches", stream);
}

}  // namespace ferry::mem::detail
