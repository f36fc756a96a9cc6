// SPDX-License-Identifier: Apache-2.0
// The backend registry: the process-wide reference and CPU backends, and what each supports.
// supports(op, dt) answers for the op's main (activation) dtype:
//   reference: f32 and f64 for every op; bf16 also for gemm (a, b), embedding (table) and
//              sum_squares (x), whose outputs stay f32/f64.
//   cpu:       f32 for every op (bf16/f16 compute is a later step; docs/kernels.md).
// Both objects are stateless, so the statics are thread-safe to use from any thread.
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {

bool ReferenceBackend::supports(OpKind op, DType dt) const {
  if (dt == DType::kF32 || dt == DType::kF64) return true;
  if (dt == DType::kBF16) {
    return op == OpKind::kGemm || op == OpKind::kEmbedding || op == OpKind::kSumSquares;
  }
  return false;
}

bool CpuBackend::supports(OpKind, DType dt) const { return dt == DType::kF32; }

Backend& reference_backend() {
  static ReferenceBackend backend;
  return backend;
}

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace ferry::kernels
