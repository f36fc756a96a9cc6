// SPDX-License-Identifier: Apache-2.0
// Launchers for the pattern fill/verify kernels (device_pattern.cu). Include only from
// src/mem/*_cuda.cpp and src/mem/cuda/*.cu. Launchers never allocate, never synchronize, and
// return the launch's cudaError_t (the caller converts it to a Status).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ferry::mem::cuda {

// d_dst[i] = pattern_byte(seed, i), i in [0, bytes).
cudaError_t launch_fill_pattern(std::uint8_t* d_dst, std::size_t bytes, std::uint32_t seed,
                                cudaStream_t stream);

// *d_count = #{i : d_src[i] != pattern_byte(seed, i)} (zeroed on the stream first).
cudaError_t launch_count_pattern_mismatches(const std::uint8_t* d_src, std::size_t bytes,
                                            std::uint32_t seed, unsigned long long* d_count,
                                            cudaStream_t stream);

}  // namespace ferry::mem::cuda
