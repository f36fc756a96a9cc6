// SPDX-License-Identifier: Apache-2.0
#include "mem/transfer_engine.h"

namespace ferry::mem {

Result<std::unique_ptr<TransferEngine>> cuda_transfer_engine(int device) {
  return unavailable("mem: no CUDA transfer engine for device {}: built without CUDA", device);
}

}  // namespace ferry::mem
