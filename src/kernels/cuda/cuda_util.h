// SPDX-License-Identifier: Apache-2.0
// Host-side CUDA helpers for kernels/cuda: CUDA/cuBLAS errors as Status (FERRY_CUDA_TRY,
// FERRY_CUBLAS_TRY), the FERRY_DEBUG_SYNC=1 switch (synchronize and check after every launch, like
// CUB_DEBUG_SYNC), and RAII stream/event owners used by tests and benches of this folder.
// CUDA API failures are conditions (Status), never aborts; see style.md's error table.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/result.h"
#include "core/status.h"
#include "mem/stream.h"

namespace ferry::kernels::cuda {

// "kernels: cuda error cudaErrorIllegalAddress (an illegal memory access...) in `stmt` at
// file:line on device N". Out-of-memory maps to resource_exhausted, the rest to internal.
Status cuda_status(cudaError_t e, const char* stmt, const char* file, int line);
Status cublas_status(cublasStatus_t e, const char* stmt, const char* file, int line);

// True when the environment has FERRY_DEBUG_SYNC=1 (read once).
bool debug_sync_enabled();

// Called after each launcher: turns its cudaError_t into a Status and, under FERRY_DEBUG_SYNC,
// synchronizes `stream` and reports any asynchronous error with the op's name.
Status check_launch(cudaError_t launch_result, const char* op, cudaStream_t stream,
                    const char* file, int line);

inline cudaStream_t native(const mem::Stream& s) { return static_cast<cudaStream_t>(s.native()); }

// Owns a non-blocking cudaStream_t; hands out a mem::Stream that borrows it.
class OwnedStream {
 public:
  static Result<OwnedStream> create(int device);
  OwnedStream(OwnedStream&& o) noexcept : s_(o.s_), device_(o.device_) { o.s_ = nullptr; }
  OwnedStream& operator=(OwnedStream&&) = delete;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream();
  cudaStream_t get() const { return s_; }
  mem::Stream stream() const { return {Device::kCuda, device_, s_}; }

 private:
  OwnedStream(cudaStream_t s, int device) : s_(s), device_(device) {}
  cudaStream_t s_ = nullptr;
  int device_ = 0;
};

// Owns a cudaEvent_t (timing enabled).
class OwnedEvent {
 public:
  static Result<OwnedEvent> create();
  OwnedEvent(OwnedEvent&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  OwnedEvent& operator=(OwnedEvent&&) = delete;
  OwnedEvent(const OwnedEvent&) = delete;
  OwnedEvent& operator=(const OwnedEvent&) = delete;
  ~OwnedEvent();
  cudaEvent_t get() const { return e_; }

 private:
  explicit OwnedEvent(cudaEvent_t e) : e_(e) {}
  cudaEvent_t e_ = nullptr;
};

}  // namespace ferry::kernels::cuda

#define FERRY_CUDA_TRY(expr)                                                            \
  do {                                                                                  \
    if (const cudaError_t ferry_ce_ = (expr); ferry_ce_ != cudaSuccess)                 \
      return ::ferry::kernels::cuda::cuda_status(ferry_ce_, #expr, __FILE__, __LINE__); \
  } while (0)

#define FERRY_CUBLAS_TRY(expr)                                                            \
  do {                                                                                    \
    if (const cublasStatus_t ferry_be_ = (expr); ferry_be_ != CUBLAS_STATUS_SUCCESS)      \
      return ::ferry::kernels::cuda::cublas_status(ferry_be_, #expr, __FILE__, __LINE__); \
  } while (0)

// Launcher call + error check + optional debug sync, returning Status from the enclosing function.
#define FERRY_LAUNCH_TRY(op, stream, expr) \
  FERRY_TRY(::ferry::kernels::cuda::check_launch((expr), op, stream, __FILE__, __LINE__))
