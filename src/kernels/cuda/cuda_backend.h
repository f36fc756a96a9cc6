// SPDX-License-Identifier: Apache-2.0
// The CUDA backend: bf16 (or f32) storage, f32 accumulation. Every method validates its views
// (on a CUDA device, contiguous, shapes consistent, supported dtypes -> Status), then enqueues on
// the Stream's native cudaStream_t and returns without waiting. GEMMs go through cuBLASLt
// (gemm_lt.h); everything else is our kernels (launchers.h). Nothing is allocated inside an op,
// except the one-time cuBLASLt workspace per stream (gemm_lt.h). Out-of-range ids in device
// tensors cannot be reported without a sync; the kernels skip them (docs/cuda.md).
// Methods are defined in cuda_backend.cpp (dense ops) and cuda_backend_moe.cpp (attention, MoE,
// cross-entropy). One instance per device, created by cuda_backend(index).
#pragma once

#include <initializer_list>
#include <string>

#include "kernels/backend.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/launchers.h"

namespace ferry::kernels::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device), name_("cuda:" + std::to_string(device)) {}
  Status init() { return gemm_.init(device_); }

  std::string_view name() const override { return name_; }
  Device device() const override { return Device::kCuda; }
  bool supports(OpKind op, DType dt) const override;
  std::size_t workspace_bytes(const CrossEntropyArgs& a) const override;
  std::size_t workspace_bytes(const AttentionBackwardArgs& a) const override;
  std::size_t workspace_bytes(const SumSquaresArgs& a) const override;

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
  // launch_hybrid_adamw (hybrid_adamw_cuda.h): every mode but f32 master + f32 states.
  Status hybrid_adamw(const HybridAdamWArgs& a, Stream& stream) override;

 private:
  Status check_stream(const char* op, const Stream& s) const;

  int device_;
  std::string name_;
  LtGemm gemm_;
};

// Validation helpers shared by the cuda_backend*.cpp files.
inline constexpr std::initializer_list<DType> kFloat = {DType::kF32, DType::kBF16};
inline constexpr std::initializer_list<DType> kF32 = {DType::kF32};
inline constexpr std::initializer_list<DType> kI32 = {DType::kI32};

// Required view: present, on CUDA, contiguous, shape matches (-1 = any extent), dtype allowed.
Status need(std::string_view op, std::string_view field, const ConstTensorView& v,
            std::initializer_list<std::int64_t> shape, std::initializer_list<DType> dtypes);
// Same, but an absent view is fine.
Status maybe(std::string_view op, std::string_view field, const ConstTensorView& v,
             std::initializer_list<std::int64_t> shape, std::initializer_list<DType> dtypes);
// dtype of b must equal dtype of a.
Status same_dtype(std::string_view op, std::string_view fa, const ConstTensorView& a,
                  std::string_view fb, const ConstTensorView& b);
inline Elt elt(DType dt) { return dt == DType::kBF16 ? Elt::kBF16 : Elt::kF32; }

}  // namespace ferry::kernels::cuda
