// SPDX-License-Identifier: Apache-2.0
// pdl_enabled() (launchers.h, used by pdl.cuh's launch_pdl): FERRY_PDL=1 and a device of compute
// capability 9.0 or newer.
#include <cuda_runtime.h>

#include <cstdlib>

#include "kernels/cuda/launchers.h"

namespace ferry::kernels::cuda {

bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FERRY_PDL");
    if (v == nullptr || v[0] != '1') return false;
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
