// SPDX-License-Identifier: Apache-2.0
// Bf16AttentionCpu: the "naive same-precision" twin of the CUDA path for style.md's tolerance rule
// on whole models (tests/gpu/model_gpu_test.cpp, tests/gpu/train_stream_gpu_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/backend.h"
#include "tests/gpu/gpu_test_util.h"

namespace ferry::testing {

// The naive same-precision twin of the CUDA path: the CPU backend, but attention sees and
// produces bf16 (supports(kAttention, kF32) is false, so ModelCompute casts around it exactly as
// it does for CUDA). Inside, the values are widened to f32 and the CPU's f32 attention runs.
class Bf16AttentionCpu final : public kernels::Backend {
 public:
  std::string_view name() const override { return "cpu+bf16-attention"; }
  Device device() const override { return Device::kCpu; }
  bool supports(kernels::OpKind op, DType dt) const override {
    if (op == kernels::OpKind::kAttention || op == kernels::OpKind::kAttentionBackward)
      return dt == DType::kBF16;
    return cpu().supports(op, dt);
  }
  std::size_t workspace_bytes(const kernels::CrossEntropyArgs& a) const override {
    return cpu().workspace_bytes(a);
  }
  Status gemm(const kernels::GemmArgs& a, mem::Stream& s) override { return cpu().gemm(a, s); }
  Status embedding(const kernels::EmbeddingArgs& a, mem::Stream& s) override {
    return cpu().embedding(a, s);
  }
  Status embedding_backward(const kernels::EmbeddingBackwardArgs& a, mem::Stream& s) override {
    return cpu().embedding_backward(a, s);
  }
  Status rms_norm(const kernels::RmsNormArgs& a, mem::Stream& s) override {
    return cpu().rms_norm(a, s);
  }
  Status rms_norm_backward(const kernels::RmsNormBackwardArgs& a, mem::Stream& s) override {
    return cpu().rms_norm_backward(a, s);
  }
  Status rope(const kernels::RopeArgs& a, mem::Stream& s) override { return cpu().rope(a, s); }
  Status swiglu(const kernels::SwiGluArgs& a, mem::Stream& s) override {
    return cpu().swiglu(a, s);
  }
  Status swiglu_backward(const kernels::SwiGluBackwardArgs& a, mem::Stream& s) override {
    return cpu().swiglu_backward(a, s);
  }
  Status add(const kernels::AddArgs& a, mem::Stream& s) override { return cpu().add(a, s); }
  Status router(const kernels::RouterArgs& a, mem::Stream& s) override {
    return cpu().router(a, s);
  }
  Status router_backward(const kernels::RouterBackwardArgs& a, mem::Stream& s) override {
    return cpu().router_backward(a, s);
  }
  Status moe_dispatch(const kernels::MoeDispatchArgs& a, mem::Stream& s) override {
    return cpu().moe_dispatch(a, s);
  }
  Status moe_dispatch_backward(const kernels::MoeDispatchBackwardArgs& a, mem::Stream& s) override {
    return cpu().moe_dispatch_backward(a, s);
  }
  Status moe_combine(const kernels::MoeCombineArgs& a, mem::Stream& s) override {
    return cpu().moe_combine(a, s);
  }
  Status moe_combine_backward(const kernels::MoeCombineBackwardArgs& a, mem::Stream& s) override {
    return cpu().moe_combine_backward(a, s);
  }
  Status cross_entropy(const kernels::CrossEntropyArgs& a, mem::Stream& s) override {
    return cpu().cross_entropy(a, s);
  }
  Status adamw(const kernels::AdamWArgs& a, mem::Stream& s) override { return cpu().adamw(a, s); }
  Status sum_squares(const kernels::SumSquaresArgs& a, mem::Stream& s) override {
    return cpu().sum_squares(a, s);
  }
  Status convert(const kernels::ConvertArgs& a, mem::Stream& s) override {
    return cpu().convert(a, s);
  }

  Status attention(const kernels::AttentionArgs& a, mem::Stream& s) override {
    HostTensor q = widened(a.q), k = widened(a.k), v = widened(a.v), out = like(a.out);
    FERRY_TRY(cpu().attention({.out = out.view(),
                               .lse = a.lse,
                               .q = q.cview(),
                               .k = k.cview(),
                               .v = v.cview(),
                               .cu_seqlens = a.cu_seqlens,
                               .scale = a.scale,
                               .causal = a.causal},
                              s));
    return narrow_into(out, a.out, s);
  }
  Status attention_backward(const kernels::AttentionBackwardArgs& a, mem::Stream& s) override {
    HostTensor q = widened(a.q), k = widened(a.k), v = widened(a.v), out = widened(a.out),
               dout = widened(a.d_out), dq = like(a.d_q), dk = like(a.d_k), dv = like(a.d_v);
    FERRY_TRY(cpu().attention_backward({.d_q = dq.view(),
                                        .d_k = dk.view(),
                                        .d_v = dv.view(),
                                        .d_out = dout.cview(),
                                        .q = q.cview(),
                                        .k = k.cview(),
                                        .v = v.cview(),
                                        .out = out.cview(),
                                        .lse = a.lse,
                                        .cu_seqlens = a.cu_seqlens,
                                        .scale = a.scale,
                                        .causal = a.causal},
                                       s));
    FERRY_TRY(narrow_into(dq, a.d_q, s));
    FERRY_TRY(narrow_into(dk, a.d_k, s));
    return narrow_into(dv, a.d_v, s);
  }

 private:
  static kernels::Backend& cpu() { return kernels::cpu_backend(); }
  static std::vector<std::int64_t> dims(const ConstTensorView& v) {
    return std::vector<std::int64_t>(v.shape.begin(), v.shape.begin() + v.ndim);
  }
  static HostTensor like(const ConstTensorView& v) { return HostTensor(dims(v), DType::kF32); }
  static HostTensor widened(const ConstTensorView& v) {
    HostTensor t = like(v);
    EXPECT_TRUE(convert_elements(v.data, v.dtype, t.data(), DType::kF32,
                                 static_cast<std::size_t>(v.numel())));
    return t;
  }
  static Status narrow_into(const HostTensor& f32, const TensorView& out, mem::Stream& s) {
    return cpu().convert({.out = out, .in = f32.cview()}, s);
  }
};

}  // namespace ferry::testing
