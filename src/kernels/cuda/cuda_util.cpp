// SPDX-License-Identifier: Apache-2.0
#include "kernels/cuda/cuda_util.h"

#include <cstdlib>
#include <cstring>

namespace ferry::kernels::cuda {

Status cuda_status(cudaError_t e, const char* stmt, const char* file, int line) {
  int dev = -1;
  (void)cudaGetDevice(&dev);
  const StatusCode code = e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted
                          : e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver
                              ? StatusCode::kUnavailable
                              : StatusCode::kInternal;
  return {code, fmt::format("kernels: cuda error {} ({}) in `{}` at {}:{} on device {}",
                            cudaGetErrorName(e), cudaGetErrorString(e), stmt, file, line, dev)};
}

Status cublas_status(cublasStatus_t e, const char* stmt, const char* file, int line) {
  const StatusCode code = e == CUBLAS_STATUS_NOT_SUPPORTED  ? StatusCode::kUnimplemented
                          : e == CUBLAS_STATUS_ALLOC_FAILED ? StatusCode::kResourceExhausted
                                                            : StatusCode::kInternal;
  return {code,
          fmt::format("kernels: cublas error {} ({}) in `{}` at {}:{}", cublasLtGetStatusName(e),
                      cublasLtGetStatusString(e), stmt, file, line)};
}

bool debug_sync_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FERRY_DEBUG_SYNC");
    return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
  }();
  return on;
}

Status check_launch(cudaError_t launch_result, const char* op, cudaStream_t stream,
                    const char* file, int line) {
  if (launch_result != cudaSuccess)
    return cuda_status(launch_result, op, file, line).with_context("launch");
  if (debug_sync_enabled()) {
    const cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return cuda_status(e, op, file, line).with_context("FERRY_DEBUG_SYNC");
  }
  return ok_status();
}

Result<OwnedStream> OwnedStream::create(int device) {
  FERRY_CUDA_TRY(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  FERRY_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return OwnedStream(s, device);
}
OwnedStream::~OwnedStream() {
  if (s_ != nullptr) (void)cudaStreamDestroy(s_);
}

Result<OwnedEvent> OwnedEvent::create() {
  cudaEvent_t e = nullptr;
  FERRY_CUDA_TRY(cudaEventCreate(&e));
  return OwnedEvent(e);
}
OwnedEvent::~OwnedEvent() {
  if (e_ != nullptr) (void)cudaEventDestroy(e_);
}

}  // namespace ferry::kernels::cuda
