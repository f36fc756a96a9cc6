// SPDX-License-Identifier: Apache-2.0
// Link pacing of the emulated device tier: makes every host->device copy of the host transfer
// engine (host_transfer_engine(), memcpy) take at least bytes / rate, as if it crossed a link of
// that rate (PCIe Gen4 x16 ~ 24 GB/s). Only for CPU builds' emulated tier and benchmarks
// (`ferry bench serve --link-gbps`); a CUDA engine's copies are paced by the real link.
// Model: one serial link, copies issued one at a time from the engine thread (the host engine is
// synchronous), so a copy that starts at t ends at max(t + memcpy time, t + bytes / rate). If
// memcpy itself is slower than the rate, nothing is added (the emulated link is then slower).
// Off (rate 0) by default. Thread-safety: the rate and the counters are atomics; pacing waits on
// the calling thread (sleep for most of a long wait, then spin: waits are often ~10 us).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace ferry::mem {

struct LinkPacerStats {
  std::uint64_t copies = 0;  // paced host->device copies
  std::uint64_t bytes = 0;   // their bytes
  double wait_s = 0;         // time added on top of memcpy
};

// bytes_per_s <= 0 turns pacing off.
void set_host_link_rate(double bytes_per_s);
double host_link_rate();
LinkPacerStats host_link_stats();

// Called by the host transfer engine after a host->device copy that began at `start`: waits until
// start + bytes / rate when pacing is on; returns at once otherwise.
void pace_host_copy(std::chrono::steady_clock::time_point start, std::size_t bytes);

}  // namespace ferry::mem
