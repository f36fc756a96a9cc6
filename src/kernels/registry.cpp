// SPDX-License-Identifier: Apache-2.0
// The backend registry: the process-wide reference and CPU backends, and what each supports.
// supports(op, dt) answers for the op's main (activation) dtype:
//   reference: f32 and f64 for every op; bf16 also for the ops whose main inputs may be bf16
//              (gemm a/b, embedding table, sum_squares x, and the attention / router / MoE /
//              cross-entropy inputs, see attn_moe_ce_checks.h); their outputs stay f32/f64.
//   cpu:       f32 for every op (bf16/f16 compute is a later step; docs/kernels.md).
// Both objects are stateless, so the statics are thread-safe to use from any thread.
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {

bool ReferenceBackend::supports(OpKind op, DType dt) const {
  if (dt == DType::kF32 || dt == DType::kF64) return true;
  if (dt != DType::kBF16) return false;
  switch (op) {
    case OpKind::kGemm:
    case OpKind::kEmbedding:
    case OpKind::kSumSquares:
    case OpKind::kAttention:
    case OpKind::kAttentionBackward:
    case OpKind::kRouter:
    case OpKind::kRouterBackward:
    case OpKind::kMoeDispatch:
    case OpKind::kMoeDispatchBackward:
    case OpKind::kMoeCombine:
    case OpKind::kMoeCombineBackward:
    case OpKind::kCrossEntropy:
    case OpKind::kConvert:
      return true;
    default:
      return false;
  }
}

bool CpuBackend::supports(OpKind op, DType dt) const {
  return dt == DType::kF32 || (op == OpKind::kConvert && dt == DType::kBF16);
}

Backend& reference_backend() {
  static ReferenceBackend backend;
  return backend;
}

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace ferry::kernels
