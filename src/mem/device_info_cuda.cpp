// SPDX-License-Identifier: Apache-2.0
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "mem/device_info.h"

namespace ferry::mem {

namespace {
std::string version_string(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }
}  // namespace

CudaInfo query_cuda_info() {
  CudaInfo info;
  info.compiled = true;
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  info.runtime_version = version_string(rt);
  if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0) {
    info.driver_version = version_string(drv);
  } else {
    info.driver_version = "none";
  }
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    info.error = cudaGetErrorString(e);
    cudaGetLastError();
    return info;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    info.devices.push_back({i, p.name, p.major, p.minor, p.totalGlobalMem});
  }
  return info;
}

}  // namespace ferry::mem
