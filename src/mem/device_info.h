// SPDX-License-Identifier: Apache-2.0
// What CUDA this build has and what devices the machine shows (for `ferry version`, error
// messages and benchmark headers). Never fails: problems are reported in `error`.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ferry::mem {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  std::size_t total_bytes = 0;
};

struct CudaInfo {
  bool compiled = false;        // built with CUDA
  std::string runtime_version;  // "13.0"
  std::string driver_version;   // "13.0" or "none"
  std::vector<CudaDeviceInfo> devices;
  std::string error;  // e.g. "no CUDA-capable device is detected"
};

CudaInfo query_cuda_info();

}  // namespace ferry::mem
