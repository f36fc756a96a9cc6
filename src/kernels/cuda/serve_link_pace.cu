// SPDX-License-Identifier: Apache-2.0
// Link pacing on a CUDA copy stream (serve/link_engine.h): two one-thread kernels that bracket
// each chunk of a paced host->device copy. mark stores the GPU's global timer (ns) before the
// first chunk; wait, enqueued after a chunk, spins until the timer reaches mark + ns (ns = the
// chunk's bytes / the paced rate) and moves the mark to the time it returns, which is where the
// next chunk of the same copy starts. The stream is in-order, so no chunk's copy can complete,
// and nothing queued after it can start, before ns have passed since the chunk could begin:
// the copy stream moves at most rate bytes per second, whatever the real link does. Each wait
// holds one thread of one SM (nanosleep between timer reads). Kernel boundaries order the mark's
// write and read (same stream). Tested in tests/gpu/serve_step_gpu_test.cpp (ServeLinkPace.*).
// Also copy_from_host: a kernel (not a copy engine) reading pinned host memory through its
// mapped address, the copy a device-side miss path would use (docs/serve.md "Device-side slot
// resolution"): ServeDeviceCopy.* measures its rate against cudaMemcpyAsync's.
#include <cstdint>

#include "kernels/cuda/link_pace.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/serve_launchers.h"

namespace ferry::kernels::cuda {
namespace {

__global__ void link_pace_mark_kernel(unsigned long long* mark) {
  pdl_wait();
  pdl_trigger();
  *mark = global_timer_ns();
}

// No pdl_trigger: the kernel after a pacing wait is scheduled when the wait ends, not held
// resident on the SMs for the whole paced interval beside the copy stream's work.
__global__ void link_pace_wait_kernel(unsigned long long* mark, unsigned long long ns) {
  pdl_wait();
  pace_wait(mark, ns);
}

// 16-byte words, 4 in flight per thread: PCIe reads are latency-bound, so the rate depends on how
// many loads the grid keeps outstanding.
__global__ void copy_from_host_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                      std::size_t n16) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < n16; i += stride) dst[i] = src[i];
}

}  // namespace

cudaError_t launch_copy_from_host(void* dst, const void* src, std::size_t bytes, int blocks,
                                  cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  copy_from_host_kernel<<<blocks, 256, 0, stream>>>(static_cast<uint4*>(dst),
                                                    static_cast<const uint4*>(src), bytes / 16);
  return cudaGetLastError();
}

cudaError_t launch_link_pace_mark(unsigned long long* d_mark, cudaStream_t stream) {
  launch_pdl(link_pace_mark_kernel, 1, 1, 0, stream, d_mark);
  return cudaGetLastError();
}

cudaError_t launch_link_pace_wait(unsigned long long* d_mark, unsigned long long ns,
                                  cudaStream_t stream) {
  launch_pdl(link_pace_wait_kernel, 1, 1, 0, stream, d_mark, ns);
  return cudaGetLastError();
}

}  // namespace ferry::kernels::cuda
