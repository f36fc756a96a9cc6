// SPDX-License-Identifier: Apache-2.0
// pdl_enabled() (launchers.h, used by pdl.cuh's launch_pdl): a device of compute capability 9.0
// or newer, unless FERRY_PDL=0 (plain launches, for A/B runs).
#include <cuda_runtime.h>

#include <cstdlib>

#include "kernels/cuda/launchers.h"

namespace ferry::kernels::cuda {

bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FERRY_PDL");
    if (v != nullptr && v[0] == '0') return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      return false;
    }
    return major >= 9;
  }();
  return on;
}

}  // namespace ferry::kernels::cuda
