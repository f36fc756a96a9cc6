// SPDX-License-Identifier: Apache-2.0
// CPU build: CUDA streams and events cannot be created; with no handle in existence, every other
// hook is unreachable and aborts if reached.
#include "core/check.h"
#include "mem/runtime_hooks.h"

namespace ferry::mem::detail {

namespace {
[[noreturn]] void no_handles(const char* what) {
  FERRY_CHECK(false, "mem: {} called in a build without CUDA (no CUDA handle can exist)", what);
  __builtin_unreachable();
}
}  // namespace

Result<void*> rt_stream_create(int device) {
  return unavailable("mem: cannot create a CUDA stream on device {}: built without CUDA", device);
}
void rt_stream_destroy(void*, int) { no_handles("rt_stream_destroy"); }
Status rt_stream_synchronize(void*) { no_handles("rt_stream_synchronize"); }
Status rt_stream_wait_event(void*, void*) { no_handles("rt_stream_wait_event"); }

Result<void*> rt_event_create(int device, bool) {
  return unavailable("mem: cannot create a CUDA event on device {}: built without CUDA", device);
}
void rt_event_destroy(void*, int) { no_handles("rt_event_destroy"); }
Status rt_event_record(void*, void*) { no_handles("rt_event_record"); }
Result<bool> rt_event_query(void*) { no_handles("rt_event_query"); }
Status rt_event_synchronize(void*) { no_handles("rt_event_synchronize"); }
Result<float> rt_event_elapsed_ms(void*, void*) { no_handles("rt_event_elapsed_ms"); }

Status rt_graph_begin_capture(void*) { no_handles("rt_graph_begin_capture"); }
Result<void*> rt_graph_end_capture(void*, int) { no_handles("rt_graph_end_capture"); }
Status rt_graph_launch(void*, void*) { no_handles("rt_graph_launch"); }
void rt_graph_destroy(void*, int) { no_handles("rt_graph_destroy"); }

Status rt_memcpy_async(void*, const void*, std::size_t, RtCopyKind, void*) {
  no_handles("rt_memcpy_async");
}
Status rt_memset_async(void*, int, std::size_t, void*) { no_handles("rt_memset_async"); }

}  // namespace ferry::mem::detail
