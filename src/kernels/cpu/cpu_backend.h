// SPDX-License-Identifier: Apache-2.0
// The CPU backend: OpenBLAS sgemm, SIMD bodies (AVX-512 / AVX2 chosen at run time by CPUID)
// with one scalar function for tails and other CPUs, threads from ThreadPool::global(). f32
// compute; bf16 weights are accepted where noted. Tested against ReferenceBackend on swept shapes.
// Methods are defined across cpu/*.cpp, one op family per file.
#pragma once

#include "kernels/backend.h"

namespace ferry::kernels {

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
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
  Status hybrid_adamw(const HybridAdamWArgs& a, Stream& stream) override;  // hybrid_adamw_op.cpp
};

}  // namespace ferry::kernels
