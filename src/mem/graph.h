// SPDX-License-Identifier: Apache-2.0
// Graph: the work one function enqueues on a stream, recorded once and replayed many times.
//
// On a CUDA stream this is a CUDA graph: capture (thread-local mode) -> instantiate -> launch, so
// a layer's dozens of kernel launches cost one launch on replay. On the host stream (CPU builds
// and CPU backends) it keeps the function and calls it again on launch — host streams execute
// synchronously, so replaying the function is exactly what a captured graph would do, and
// executors that use Graph run unchanged on the CPU.
//
// A captured CUDA graph bakes in every pointer and scalar the function passed to its kernels:
// replays read and write the same buffers (refresh their contents, not their addresses). Warm up
// eagerly before capturing: first-use work such as cuBLASLt's per-stream workspace allocation or
// GEMM autotuning cannot happen inside a capture (an allocation there fails with a clear error;
// autotuning is skipped and the heuristic's first algorithm is baked in).
#pragma once

#include <functional>

#include "core/result.h"
#include "mem/stream.h"

namespace ferry::mem {

class Graph {
 public:
  // Records what `record` enqueues on `stream`. If `record` fails, the capture is abandoned and
  // its Status returned; nothing stays captured.
  static Result<Graph> capture(Stream& stream, std::function<Status()> record);

  Graph() = default;
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();

  // Enqueues one replay on `stream` (the capture's device; any stream of it for CUDA graphs).
  Status launch(Stream& stream);

  bool empty() const { return exec_ == nullptr && !host_fn_; }

 private:
  Device device_ = Device::kCpu;
  int device_index_ = 0;
  void* exec_ = nullptr;             // cudaGraphExec_t
  std::function<Status()> host_fn_;  // host stream: the function itself
};

}  // namespace ferry::mem
