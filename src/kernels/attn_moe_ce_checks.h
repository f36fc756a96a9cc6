// SPDX-License-Identifier: Apache-2.0
// Argument validation shared by the reference and CPU backends for the attention, MoE (router,
// dispatch, combine) and fused cross-entropy ops, plus the reference backend's element access.
// Why one place: both backends must reject exactly the same inputs with the same messages, so the
// tests can run every malformed case against both. Every check returns a Status (never aborts):
// missing views, wrong shapes, non-float/non-i32 dtypes and out-of-range ids/targets/cu_seqlens
// -> invalid_argument; float dtypes a backend does not compute in, non-contiguous views and
// device views -> unimplemented (the same split as ref/arg_checks.h for the dense ops).
// Data checks (cu_seqlens, ids, slots, targets) run before any output is written.
// Covered by tests/unit/kernels/{attention,router,moe,cross_entropy}_*test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/result.h"
#include "core/status.h"
#include "kernels/ops.h"

namespace ferry::kernels::detail {

// Which float dtypes a backend computes with.
//   kF32: every float view is f32 (CPU backend).
//   kRef: float inputs may be f32, f64 or bf16; float outputs f32 or f64 (reference backend).
enum class FloatSet : std::uint8_t { kF32, kRef };

struct AttentionDims {
  std::int64_t T = 0, H = 0, G = 0, D = 0, S = 0;
  double scale = 0.0;  // resolved: args.scale, or 1/sqrt(D) when args.scale == 0
};
Result<AttentionDims> check_attention(const AttentionArgs& a, FloatSet fs);
Result<AttentionDims> check_attention_backward(const AttentionBackwardArgs& a, FloatSet fs);

struct RouterDims {
  std::int64_t T = 0, E = 0, K = 0;
};
Result<RouterDims> check_router(const RouterArgs& a, FloatSet fs);
Result<RouterDims> check_router_backward(const RouterBackwardArgs& a, FloatSet fs);

struct MoeDims {
  std::int64_t T = 0, K = 0, C = 0, E = 0;  // E only for dispatch
};
Result<MoeDims> check_moe_dispatch(const MoeDispatchArgs& a, FloatSet fs);
Result<MoeDims> check_moe_dispatch_backward(const MoeDispatchBackwardArgs& a, FloatSet fs);
Result<MoeDims> check_moe_combine(const MoeCombineArgs& a, FloatSet fs);
Result<MoeDims> check_moe_combine_backward(const MoeCombineBackwardArgs& a, FloatSet fs);

struct CrossEntropyDims {
  std::int64_t T = 0, C = 0, V = 0;
  std::int64_t chunk = 0;  // rows per chunk: min(chunk_tokens, T), at least 1
};
// Rows of logits one chunk holds (0 when the shapes are unusable; the op then reports why).
std::int64_t cross_entropy_chunk_rows(const CrossEntropyArgs& a);
// logit_bytes: bytes per workspace logit (8 for the reference's f64, 4 for the CPU's f32).
Result<CrossEntropyDims> check_cross_entropy(const CrossEntropyArgs& a, FloatSet fs,
                                             std::size_t logit_bytes);

// Element access for the reference backend: flat element index into a contiguous view of
// f32 / f64 / bf16 / f16. Slow on purpose (a switch per element); the reference is the spec.
inline double load(const ConstTensorView& v, std::int64_t i) {
  switch (v.dtype) {
    case DType::kF32:
      return v.as<float>()[i];
    case DType::kF64:
      return v.as<double>()[i];
    case DType::kBF16:
      return bf16_to_f32(v.as<std::uint16_t>()[i]);
    case DType::kF16:
      return f16_to_f32(v.as<std::uint16_t>()[i]);
    default:
      FERRY_CHECK(false, "kernels: load from non-float view (validation missed it)");
  }
  return 0.0;
}
inline void store(const TensorView& v, std::int64_t i, double x) {
  switch (v.dtype) {
    case DType::kF32:
      v.as<float>()[i] = static_cast<float>(x);
      return;
    case DType::kF64:
      v.as<double>()[i] = x;
      return;
    default:
      FERRY_CHECK(false, "kernels: store to unsupported view (validation missed it)");
  }
}
inline std::int32_t load_i32(const ConstTensorView& v, std::int64_t i) {
  return v.as<std::int32_t>()[i];
}

}  // namespace ferry::kernels::detail
