// SPDX-License-Identifier: Apache-2.0
// The device side of link pacing, shared by the copy stream's pace kernels (serve_link_pace.cu)
// and the device slot resolver's paced miss copies (serve_slot_resolve.cu): the GPU's global
// timer in ns, and the wait that spins (nanosleep between timer reads) until *mark + ns, then
// moves the mark to the time it returns.
#pragma once

namespace ferry::kernels::cuda {

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void pace_wait(unsigned long long* mark, unsigned long long ns) {
  const unsigned long long until = *mark + ns;
  unsigned long long now = global_timer_ns();
  while (now < until) {
    const unsigned long long left = until - now;
    __nanosleep(left > 4000ull ? 2000u : 100u);
    now = global_timer_ns();
  }
  *mark = now;
}

}  // namespace ferry::kernels::cuda
