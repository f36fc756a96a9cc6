// SPDX-License-Identifier: Apache-2.0
// The reference backend: naive loops with f64 accumulation, single-threaded, obviously correct.
// It is the executable spec every other backend is tested against. Supports f32 and f64 tensors
// (and bf16 inputs where noted); outputs are written in the output view's dtype.
// Methods are defined across ref/*.cpp, one op family per file.
#pragma once

#include "kernels/backend.h"

namespace ferry::kernels {

class ReferenceBackend final : public Backend {
 public:
  std::string_view name() const override { return "reference"; }
  Device device() const override { return Device::kCpu; }
  bool supports(OpKind op, DType dt) const override;
  std::size_t workspace_bytes(const CrossEntropyArgs& a) const override;

  Status gemm(const GemmArgs& a, Stream& stream) override;
  Status embedding(const EmbeddingArgs& a, Stream& stream) override;
  Status embedding_backward(const EmbeddingBackwardArgs& a, Stream& stream) override;
  Status rms_norm(const RmsNormArgs& a, Stream& stream) override;
  Status rms_norm_backward(const RmsNormBackwardArgs& a, Stream& stream) override;
  Status rope(const RopeArgs& a, Stream& stream) override;
  Status attention(const AttentionArgs& a, Stream& stream) override;
  Status attention_backward(const AttentionBackwardArgs& a, Stream& stream) override;
  Status swiglu(const SwiGluArgs& a, Stream& stream) override;
  Status swiglu_backward(const SwiGluBackwardArgs& a, Stream& stream) override;
  Status add(const AddArgs& a, Stream& stream) override;
  Status router(const RouterArgs& a, Stream& stream) override;
  Status router_backward(const RouterBackwardArgs& a, Stream& stream) override;
  Status moe_dispatch(const MoeDispatchArgs& a, Stream& stream) override;
  Status moe_dispatch_backward(const MoeDispatchBackwardArgs& a, Stream& stream) override;
  Status moe_combine(const MoeCombineArgs& a, Stream& stream) override;
  Status moe_combine_backward(const MoeCombineBackwardArgs& a, Stream& stream) override;
  Status cross_entropy(const CrossEntropyArgs& a, Stream& stream) override;
  Status adamw(const AdamWArgs& a, Stream& stream) override;
  Status sum_squares(const SumSquaresArgs& a, Stream& stream) override;
  Status convert(const ConvertArgs& a, Stream& stream) override;
};

}  // namespace ferry::kernels
