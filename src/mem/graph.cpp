// SPDX-License-Identifier: Apache-2.0
// Graph: host graphs keep the function; CUDA graphs go through runtime_hooks.h.
#include "mem/graph.h"

#include <utility>

#include "core/check.h"
#include "mem/runtime_hooks.h"

namespace ferry::mem {

Result<Graph> Graph::capture(Stream& stream, std::function<Status()> record) {
  if (!record) return invalid_argument("mem: graph capture without a function");
  Graph g;
  g.device_ = stream.device();
  g.device_index_ = stream.device_index();
  if (stream.device() == Device::kCpu) {
    // The first run is the capture's own execution, as with CUDA graphs (whose capture does not
    // execute): callers launch afterwards either way, so the host path must not run it here.
    g.host_fn_ = std::move(record);
    return g;
  }
  FERRY_TRY(detail::rt_graph_begin_capture(stream.native()));
  const Status recorded = record();
  // End the capture whatever happened, so the stream leaves capture mode.
  Result<void*> exec = detail::rt_graph_end_capture(stream.native(), g.device_index_);
  if (!recorded.ok()) {
    if (exec.ok()) detail::rt_graph_destroy(*exec, g.device_index_);
    return recorded;
  }
  FERRY_ASSIGN_OR_RETURN(g.exec_, std::move(exec));
  return g;
}

Graph::Graph(Graph&& other) noexcept
    : device_(other.device_),
      device_index_(other.device_index_),
      exec_(std::exchange(other.exec_, nullptr)),
      host_fn_(std::move(other.host_fn_)) {
  other.host_fn_ = nullptr;
}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    if (exec_ != nullptr) detail::rt_graph_destroy(exec_, device_index_);
    device_ = other.device_;
    device_index_ = other.device_index_;
    exec_ = std::exchange(other.exec_, nullptr);
    host_fn_ = std::move(other.host_fn_);
    other.host_fn_ = nullptr;
  }
  return *this;
}

Graph::~Graph() {
  if (exec_ != nullptr) detail::rt_graph_destroy(exec_, device_index_);
}

Status Graph::launch(Stream& stream) {
  if (empty()) return invalid_argument("mem: launch of an empty (moved-from or default) graph");
  if (stream.device() != device_ || stream.device_index() != device_index_) {
    return invalid_argument("mem: graph captured on {} {} launched on {} {}", to_string(device_),
                            device_index_, to_string(stream.device()), stream.device_index());
  }
  if (host_fn_) return host_fn_();
  return detail::rt_graph_launch(exec_, stream.native());
}

}  // namespace ferry::mem
