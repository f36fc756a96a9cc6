// SPDX-License-Identifier: Apache-2.0
// WeightStreamer: a dedicated transfer thread that copies layer weights from the host arena into
// a ring of device weight slots ahead of compute, following one micro-batch's weight schedule
// (activation_policy.h weight_schedule: forward, recompute and backward streams in order).
//
//   start_micro_batch();                       // the thread begins copying item 0, 1, ...
//   int s = acquire(j);  ... compute reads slot s in place ...  release(j);
//
// Item j goes to slot j % slots. The thread copies item j once (a) item j - slots was released
// (its slot is free) and (b) the layer's pending optimizer update is done (LayerOptimizer::
// wait_ready) — so at most `slots` items are in flight, prefetch depth = slots - 1 beyond the
// one in use. Copies go through mem::TransferEngine (h2d on the h2d stream; the host engine's
// memcpy in CPU builds) and are counted here; bf16 weights (bf16 masters) cross as bf16 and are
// widened into the slot (bf16_widen.h: in place on the emulated tier, from a staging buffer by
// the backend's convert kernel on the h2d stream on a GPU) — or, with bf16 weight views (GPU,
// bf16 GEMMs), land in the slot's bf16 twin, which the GEMMs read in place, and only the
// parameters read as f32 are widened. The executor's ExposureClock
// measures how long compute waits in acquire().
// GPU compute runs behind the thread that enqueues it, so "released" is not "done reading":
// release(j) records the slot's free event on the compute stream and the copy of item j + slots
// waits for it on the h2d stream (device side). With host streams the events are always complete
// and this is the CPU executor's behaviour unchanged.
// Threading: acquire/release/start from the compute thread only.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "mem/event.h"
#include "mem/stream_set.h"
#include "mem/transfer_engine.h"
#include "train/stream/bf16_widen.h"
#include "train/stream/host_arena.h"
#include "train/stream/layer_optimizer.h"

namespace ferry::train::stream {

class WeightStreamer {
 public:
  // slots: device-tier buffers of max_layer_elements floats each (>= 2).
  // compute: the stream whose kernels read the slots (events of its device are created here).
  // landing: how bf16 weights are widened into a slot; required when arena.bf16_weights().
  // views (bf16 weight views, bf16_widen.h): instead, each slot's layer lands in twins[slot]
  // (the largest layer's bf16 weights each) and only its f32-read parameters are widened into
  // slots[slot] (then the f32 part only); twins has one entry per slot.
  static Result<std::unique_ptr<WeightStreamer>> create(
      const HostArena& arena, LayerOptimizer& opt, std::vector<float*> slots,
      std::vector<int> schedule, mem::TransferEngine& engine, mem::Stream& h2d,
      mem::Stream& compute, const Bf16Landing* landing = nullptr,
      const Bf16ViewLanding* views = nullptr, std::vector<std::uint16_t*> twins = {});
  ~WeightStreamer();
  WeightStreamer(const WeightStreamer&) = delete;
  WeightStreamer& operator=(const WeightStreamer&) = delete;

  void start_micro_batch();
  // Blocks until item j (layer schedule()[j]) is in its slot.
  Result<int> acquire(int j);
  void release(int j);
  // Blocks until the thread has copied the whole schedule (end of a micro-batch).
  Status finish();

  const std::vector<int>& schedule() const { return schedule_; }
  std::uint64_t h2d_bytes() const;

 private:
  WeightStreamer(const HostArena& arena, LayerOptimizer& opt, std::vector<float*> slots,
                 std::vector<int> schedule, mem::TransferEngine& engine, mem::Stream& h2d,
                 mem::Stream& compute, const Bf16Landing* landing, const Bf16ViewLanding* views,
                 std::vector<std::uint16_t*> twins, std::vector<mem::Event> free);
  void run();

  const HostArena& arena_;
  LayerOptimizer& opt_;
  std::vector<float*> slots_;
  std::vector<int> schedule_;
  mem::TransferEngine& engine_;
  mem::Stream& h2d_;
  mem::Stream& compute_;
  const Bf16Landing* landing_;
  const Bf16ViewLanding* views_;
  std::vector<std::uint16_t*> twins_;  // [slot], with views_
  std::vector<mem::Event> free_;       // [slot]: recorded on compute at release

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t epoch_ = 0;  // micro-batches started
  int produced_ = 0;         // items of the current micro-batch copied
  int released_ = 0;         // items of the current micro-batch released
  std::uint64_t bytes_ = 0;
  Status error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ferry::train::stream
