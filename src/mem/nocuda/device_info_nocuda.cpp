// SPDX-License-Identifier: Apache-2.0
#include "mem/device_info.h"

namespace ferry::mem {

CudaInfo query_cuda_info() { return {}; }

}  // namespace ferry::mem
