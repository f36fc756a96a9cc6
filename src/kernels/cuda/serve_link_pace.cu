// SPDX-License-Identifier: Apache-2.0
// Link pacing on a CUDA copy stream (serve/link_engine.h): two one-thread kernels that bracket
// each chunk of a paced host->device copy. mark stores the GPU's global timer (ns) before the
// first chunk; wait, enqueued after a chunk, spins until the timer reaches mark + ns (ns = the
// chunk's bytes / the paced rate) and moves the mark to the time it returns, which is where the
// next chunk of the same copy starts. The stream is in-order, so no chunk's copy can complete,
// and nothing queued after it can start, before ns have passed since the chunk could begin:
// the copy stream moves at most rate bytes per second, whatever the real link does. Each wait
// holds one thread of one SM (nanosleep between timer reads). Kernel boundaries order the mark's
// write and read (same stream). Tested in tests/gpu/serve_gpu_test.cpp (ServeLinkPace.*).
#include <cstdint>

#include "kernels/cuda/serve_launchers.h"

namespace ferry::kernels::cuda {
namespace {

__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void link_pace_mark_kernel(unsigned long long* mark) { *mark = global_timer_ns(); }

__global__ void link_pace_wait_kernel(unsigned long long* mark, unsigned long long ns) {
  const unsigned long long until = *mark + ns;
  unsigned long long now = global_timer_ns();
  while (now < until) {
    const unsigned long long left = until - now;
    __nanosleep(left > 4000ull ? 2000u : 100u);
    now = global_timer_ns();
  }
  *mark = now;
}

}  // namespace

cudaError_t launch_link_pace_mark(unsigned long long* d_mark, cudaStream_t stream) {
  link_pace_mark_kernel<<<1, 1, 0, stream>>>(d_mark);
  return cudaGetLastError();
}

cudaError_t launch_link_pace_wait(unsigned long long* d_mark, unsigned long long ns,
                                  cudaStream_t stream) {
  link_pace_wait_kernel<<<1, 1, 0, stream>>>(d_mark, ns);
  return cudaGetLastError();
}

}  // namespace ferry::kernels::cuda
