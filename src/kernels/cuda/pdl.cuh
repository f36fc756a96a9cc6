// SPDX-License-Identifier: Apache-2.0
// Programmatic dependent launch (sm_90+; docs/cuda.md "Programmatic dependent launch"): a kernel
// launched through launch_pdl may be scheduled while the kernel before it in its stream is still
// draining, instead of after it has completed, which hides the gap between the small dependent
// kernels of a decode step (~11 per layer, ~150 us per layer of which the kernels' own times are
// ~120). Its correctness rests on one rule: every kernel launched through launch_pdl calls
// pdl_wait() before it reads or writes global memory. griddepcontrol.wait returns once the
// kernels this grid depends on have completed and their memory is visible, so such a kernel
// sees exactly what a plain launch would (the same bits), whatever runs early. pdl_trigger()
// (after pdl_wait) lets the next launch_pdl kernel be scheduled now rather than at this grid's
// end; it changes nothing that kernel reads, since that kernel waits for this grid to complete.
// Both are no-ops in a plain launch and below sm_90. On (pdl_enabled()) unless FERRY_PDL=0 or the
// device is below compute capability 9.0: then launch_pdl is an ordinary launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/launchers.h"  // pdl_enabled()

namespace ferry::kernels::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization attribute
// when pdl_enabled(). The kernel must start with pdl_wait() (above). Returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                       cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

}  // namespace ferry::kernels::cuda
