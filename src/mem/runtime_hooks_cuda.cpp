// SPDX-License-Identifier: Apache-2.0
// CUDA build: streams are non-blocking (no implicit sync with the legacy default stream), events
// are created with timing disabled (cheapest to record/query).
#include <cuda_runtime.h>

#include "core/check.h"
#include "mem/cuda/cuda_util.h"
#include "mem/runtime_hooks.h"

namespace ferry::mem::detail {

Result<void*> rt_stream_create(int device) {
  ScopedDevice guard(device);
  FERRY_CUDA_TRY(guard.status());
  cudaStream_t s = nullptr;
  FERRY_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return static_cast<void*>(s);
}

void rt_stream_destroy(void* stream, int device) {
  ScopedDevice guard(device);
  const cudaError_t e = cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  FERRY_CHECK(e == cudaSuccess, "mem: cudaStreamDestroy failed: {}", cudaGetErrorName(e));
}

Status rt_stream_synchronize(void* stream) {
  FERRY_CUDA_TRY(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return {};
}

Status rt_stream_wait_event(void* stream, void* event) {
  FERRY_CUDA_TRY(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
  return {};
}

Result<void*> rt_event_create(int device, bool timing) {
  ScopedDevice guard(device);
  FERRY_CUDA_TRY(guard.status());
  cudaEvent_t e = nullptr;
  FERRY_CUDA_TRY(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return static_cast<void*>(e);
}

void rt_event_destroy(void* event, int device) {
  ScopedDevice guard(device);
  const cudaError_t e = cudaEventDestroy(static_cast<cudaEvent_t>(event));
  FERRY_CHECK(e == cudaSuccess, "mem: cudaEventDestroy failed: {}", cudaGetErrorName(e));
}

Status rt_event_record(void* event, void* stream) {
  FERRY_CUDA_TRY(
      cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
  return {};
}

Result<bool> rt_event_query(void* event) {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  return cuda_status(e, "cudaEventQuery(event)", __FILE__, __LINE__);
}

Status rt_event_synchronize(void* event) {
  FERRY_CUDA_TRY(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  return {};
}

Result<float> rt_event_elapsed_ms(void* start, void* end) {
  float ms = 0.0f;
  FERRY_CUDA_TRY(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

Status rt_graph_begin_capture(void* stream) {
  // Thread-local mode: another thread's unsafe calls (cudaMalloc, ...) do not break this capture,
  // while this thread's are refused with an error instead of being silently recorded.
  FERRY_CUDA_TRY(
      cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal));
  return {};
}

Result<void*> rt_graph_end_capture(void* stream, int device) {
  ScopedDevice guard(device);
  FERRY_CUDA_TRY(guard.status());
  cudaGraph_t graph = nullptr;
  FERRY_CUDA_TRY(cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph does not need it
  FERRY_CUDA_TRY(e);
  return static_cast<void*>(exec);
}

Status rt_graph_launch(void* exec, void* stream) {
  FERRY_CUDA_TRY(
      cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(stream)));
  return {};
}

void rt_graph_destroy(void* exec, int device) {
  ScopedDevice guard(device);
  const cudaError_t e = cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
  FERRY_CHECK(e == cudaSuccess, "mem: cudaGraphExecDestroy failed: {}", cudaGetErrorName(e));
}

Status rt_memcpy_async(void* dst, const void* src, std::size_t bytes, RtCopyKind kind,
                       void* stream) {
  cudaMemcpyKind k = cudaMemcpyDefault;
  switch (kind) {
    case RtCopyKind::kHostToDevice:
      k = cudaMemcpyHostToDevice;
      break;
    case RtCopyKind::kDeviceToHost:
      k = cudaMemcpyDeviceToHost;
      break;
    case RtCopyKind::kDeviceToDevice:
      k = cudaMemcpyDeviceToDevice;
      break;
    case RtCopyKind::kHostToHost:
      k = cudaMemcpyHostToHost;
      break;
  }
  FERRY_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream)));
  return {};
}

Status rt_memset_async(void* dst, int value, std::size_t bytes, void* stream) {
  FERRY_CUDA_TRY(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)));
  return {};
}

}  // namespace ferry::mem::detail
