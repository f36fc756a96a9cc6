// SPDX-License-Identifier: Apache-2.0
// TEMPORARY: registry placeholders until ref/reference_backend.cpp and cpu/cpu_backend.cpp land.
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {

bool ReferenceBackend::supports(OpKind, DType) const { return false; }
bool CpuBackend::supports(OpKind, DType) const { return false; }
Backend& reference_backend() {
  static ReferenceBackend b;
  return b;
}
Backend& cpu_backend() {
  static CpuBackend b;
  return b;
}

}  // namespace ferry::kernels
