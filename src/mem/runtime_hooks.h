// SPDX-License-Identifier: Apache-2.0
// The handful of CUDA runtime calls that streams, events and the CUDA transfer engine need,
// behind a CUDA-free interface. Internal to mem/. Implemented by runtime_hooks_cuda.cpp in CUDA
// builds; nocuda/runtime_hooks_nocuda.cpp makes creation return `unavailable` and treats any other
// call as a bug (no CUDA handle can exist in a CPU build). Handles are cudaStream_t/cudaEvent_t.
#pragma once

#include <cstddef>

#include "core/result.h"

namespace ferry::mem::detail {

Result<void*> rt_stream_create(int device);
void rt_stream_destroy(void* stream, int device);
Status rt_stream_synchronize(void* stream);
Status rt_stream_wait_event(void* stream, void* event);

// timing: events whose elapsed time can be read (rt_event_elapsed_ms); others are cheaper.
Result<void*> rt_event_create(int device, bool timing = false);
void rt_event_destroy(void* event, int device);
Status rt_event_record(void* event, void* stream);
Result<bool> rt_event_query(void* event);
Status rt_event_synchronize(void* event);
// Milliseconds between two completed timing events.
Result<float> rt_event_elapsed_ms(void* start, void* end);

// CUDA graphs (graph.h): thread-local capture on a stream; end returns the instantiated
// cudaGraphExec_t (the intermediate cudaGraph_t is destroyed).
Status rt_graph_begin_capture(void* stream);
Result<void*> rt_graph_end_capture(void* stream, int device);
Status rt_graph_launch(void* exec, void* stream);
void rt_graph_destroy(void* exec, int device);

enum class RtCopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kHostToHost };
Status rt_memcpy_async(void* dst, const void* src, std::size_t bytes, RtCopyKind kind,
                       void* stream);
Status rt_memset_async(void* dst, int value, std::size_t bytes, void* stream);

}  // namespace ferry::mem::detail
