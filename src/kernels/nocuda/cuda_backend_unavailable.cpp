// SPDX-License-Identifier: Apache-2.0
// Built only without CUDA: cuda_backend() reports that plainly.
#include "kernels/backend.h"

namespace ferry::kernels {

Result<Backend*> cuda_backend(int /*device_index*/) {
  return unavailable("kernels: built without CUDA (nvcc was not found at configure time)");
}

}  // namespace ferry::kernels
