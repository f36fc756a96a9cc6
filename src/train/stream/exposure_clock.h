// SPDX-License-Identifier: Apache-2.0
// ExposureClock: how long compute waited on transfers, in total and per plan window, and how long
// each window took — the stream executor's measurements for #7's per-window report.
//
// Host compute (the CPU backend): the compute thread is the compute, so host timers around each
// wait measure exactly the time lost.
// GPU compute: the compute thread enqueues kernels and runs ahead of the GPU, so the time the host
// is blocked is not time the GPU lost. A pair of timing events is recorded on the compute stream
// around each wait — `begin` before the host blocks (or before an exposed copy is enqueued on the
// compute stream), `end` when it resumes (after that copy). The GPU time between them is what the
// wait cost the GPU: its idle time plus any copy enqueued in between; close to 0 when the GPU
// still had queued work by the time the host resumed. Windows get an event pair too (GPU time
// from the window's first to last enqueued work). All events are read by collect(), after the
// micro-batch's work completed (the caller synchronizes the compute stream first).
//
//   clock.begin_micro_batch();
//   clock.window_begin(w);  clock.wait_begin(); ...block or enqueue a copy...; clock.wait_end();
//   clock.window_end();     ...  sync compute;  clock.collect(&exposed, window_s, window_exposed);
//
// No allocation after create(); from the compute thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/result.h"
#include "core/timer.h"
#include "mem/event.h"
#include "mem/stream.h"

namespace ferry::train::stream {

class ExposureClock {
 public:
  // gpu_compute: the GPU compute stream, or nullptr for host compute. max_waits and windows: the
  // most waits and the number of windows (each opened at most once) per micro-batch.
  static Result<std::unique_ptr<ExposureClock>> create(mem::Stream* gpu_compute, int max_waits,
                                                       int windows);

  void begin_micro_batch();
  Status wait_begin();
  Status wait_end();  // attributed to the open window, if any (else only to the total)
  Status window_begin(int w);
  Status window_end();
  // Adds this micro-batch's seconds into the totals (GPU: after the compute stream completed).
  Status collect(double* exposed_s, std::vector<double>& window_s,
                 std::vector<double>& window_exposed_s);
  bool on_gpu() const { return stream_ != nullptr; }

 private:
  struct Pair {
    mem::Event begin, end;
    int window = -1;
  };
  ExposureClock() = default;

  mem::Stream* stream_ = nullptr;
  // GPU: event pairs, used in order per micro-batch.
  std::vector<Pair> waits_, windows_;
  int waits_used_ = 0, windows_used_ = 0;
  // Host: running timers and this micro-batch's sums.
  Timer wait_timer_, window_timer_;
  double exposed_s_ = 0.0;
  std::vector<double> window_s_, window_exposed_s_;
  int open_window_ = -1;
  bool in_wait_ = false;
};

}  // namespace ferry::train::stream
