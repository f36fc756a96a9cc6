// SPDX-License-Identifier: Apache-2.0
// The Backend interface (ggml's backend, llm.c's flat arguments, CUB's explicit stream).
// One call = one op over whole tensors, so a virtual call is noise.
// Contract for every method: enqueue on `stream` (CPU backends run synchronously), never block the
// host on a GPU backend, never allocate (scratch comes from args.workspace, sized by
// workspace_bytes()). Unsupported dtype/shape -> Status::unimplemented; malformed inputs that a
// user can cause (token id out of range) -> invalid_argument; a shape mismatch between our own
// modules is a bug -> FERRY_CHECK.
//
//   auto& be = kernels::cpu_backend();
//   FERRY_TRY(be.rms_norm({.out = y, .in = x, .weight = w, .eps = 1e-6f}, mem::Stream::host()));
#pragma once

#include <cstddef>
#include <string_view>

#include "core/result.h"
#include "core/status.h"
#include "kernels/ops.h"
#include "mem/stream.h"

namespace ferry::kernels {

using mem::Stream;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;
  virtual bool supports(OpKind op, DType dt) const = 0;

  virtual std::size_t workspace_bytes(const CrossEntropyArgs& a) const = 0;
  // Optional scratch that speeds attention_backward up (0: the backend has no use for it).
  virtual std::size_t workspace_bytes(const AttentionBackwardArgs& a) const { return 0; }
  // Optional scratch that lets sum_squares use the whole device (0: the backend has no use).
  virtual std::size_t workspace_bytes(const SumSquaresArgs& a) const { return 0; }

  virtual Status gemm(const GemmArgs& a, Stream& stream) = 0;
  virtual Status embedding(const EmbeddingArgs& a, Stream& stream) = 0;
  virtual Status embedding_backward(const EmbeddingBackwardArgs& a, Stream& stream) = 0;
  virtual Status rms_norm(const RmsNormArgs& a, Stream& stream) = 0;
  virtual Status rms_norm_backward(const RmsNormBackwardArgs& a, Stream& stream) = 0;
  virtual Status rope(const RopeArgs& a, Stream& stream) = 0;
  virtual Status attention(const AttentionArgs& a, Stream& stream) = 0;
  virtual Status attention_backward(const AttentionBackwardArgs& a, Stream& stream) = 0;
  virtual Status swiglu(const SwiGluArgs& a, Stream& stream) = 0;
  virtual Status swiglu_backward(const SwiGluBackwardArgs& a, Stream& stream) = 0;
  virtual Status add(const AddArgs& a, Stream& stream) = 0;
  virtual Status router(const RouterArgs& a, Stream& stream) = 0;
  virtual Status router_backward(const RouterBackwardArgs& a, Stream& stream) = 0;
  virtual Status moe_dispatch(const MoeDispatchArgs& a, Stream& stream) = 0;
  virtual Status moe_dispatch_backward(const MoeDispatchBackwardArgs& a, Stream& stream) = 0;
  virtual Status moe_combine(const MoeCombineArgs& a, Stream& stream) = 0;
  virtual Status moe_combine_backward(const MoeCombineBackwardArgs& a, Stream& stream) = 0;
  virtual Status cross_entropy(const CrossEntropyArgs& a, Stream& stream) = 0;
  virtual Status adamw(const AdamWArgs& a, Stream& stream) = 0;
  virtual Status sum_squares(const SumSquaresArgs& a, Stream& stream) = 0;
  virtual Status convert(const ConvertArgs& a, Stream& stream) = 0;
  // The hybrid AdamW span (ops.h); backends without it say so. Arguments are checked (Status).
  virtual Status hybrid_adamw(const HybridAdamWArgs& a, Stream& stream) {
    (void)a;
    (void)stream;
    return unimplemented("kernels: {} has no hybrid_adamw", name());
  }
};

Backend& reference_backend();  // ref/: naive loops, f64 accumulation — the executable spec
Backend& cpu_backend();        // cpu/: OpenBLAS + SIMD (run-time ISA choice) + threads
// The CUDA backend for a device; unavailable when built without CUDA or no such device.
Result<Backend*> cuda_backend(int device_index);

}  // namespace ferry::kernels
