// SPDX-License-Identifier: Apache-2.0
// CUDA error -> Status conversion (FERRY_CUDA_TRY) and a scoped current-device guard.
// Include ONLY from src/mem/*_cuda.cpp and src/mem/cuda/*.cu: it pulls in cuda_runtime.h.
//
// Policy (style.md): cudaErrorMemoryAllocation is a condition (resource_exhausted); everything
// else is reported as kInternal carrying the CUDA error name, the statement, device and file:line.
#pragma once

#include <cuda_runtime.h>

#include "core/status.h"

namespace ferry {

inline Status cuda_status(cudaError_t e, const char* expr, const char* file, int line) {
  int device = -1;
  cudaGetDevice(&device);
  cudaGetLastError();  // clear the sticky-free (non-fatal) error state
  const StatusCode code =
      e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  return {code, fmt::format("cuda: {} ({}) in `{}` on device {} at {}:{}", cudaGetErrorName(e),
                            cudaGetErrorString(e), expr, device, file, line)};
}

}  // namespace ferry

#define FERRY_CUDA_TRY(expr)                                             \
  do {                                                                   \
    if (const cudaError_t ferry_ce_ = (expr); ferry_ce_ != cudaSuccess)  \
      return ::ferry::cuda_status(ferry_ce_, #expr, __FILE__, __LINE__); \
  } while (0)

namespace ferry::mem::detail {

// Makes `device` current for the guard's lifetime, restoring the previous device afterwards.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    cudaGetDevice(&prev_);
    if (prev_ != device) status_ = cudaSetDevice(device);
  }
  ~ScopedDevice() {
    if (status_ == cudaSuccess) cudaSetDevice(prev_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int prev_ = 0;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace ferry::mem::detail
