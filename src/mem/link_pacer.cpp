// SPDX-License-Identifier: Apache-2.0
#include "mem/link_pacer.h"

#include <atomic>
#include <thread>

namespace ferry::mem {
namespace {

std::atomic<double> g_rate{0.0};
std::atomic<std::uint64_t> g_copies{0}, g_bytes{0}, g_wait_ns{0};

}  // namespace

void set_host_link_rate(double bytes_per_s) { g_rate = bytes_per_s > 0 ? bytes_per_s : 0.0; }

double host_link_rate() { return g_rate; }

LinkPacerStats host_link_stats() {
  return {g_copies.load(), g_bytes.load(), double(g_wait_ns.load()) * 1e-9};
}

void pace_host_copy(std::chrono::steady_clock::time_point start, std::size_t bytes) {
  const double rate = g_rate;
  if (rate <= 0) return;
  using Clock = std::chrono::steady_clock;
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(double(bytes) / rate));
  const auto now = Clock::now();
  ++g_copies;
  g_bytes += bytes;
  if (now >= deadline) return;
  // Sleep through all but the last 200 us (the scheduler's wake-up slack), then spin.
  constexpr auto kSpin = std::chrono::microseconds(200);
  if (deadline - now > kSpin) std::this_thread::sleep_for(deadline - now - kSpin);
  while (Clock::now() < deadline) {
  }
  g_wait_ns += std::uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - now).count());
}

}  // namespace ferry::mem
