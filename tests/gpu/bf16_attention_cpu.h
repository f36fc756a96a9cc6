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
#include "unit/kernels/forwarding_backend.h"

namespace ferry::testing {

// The naive same-precision twin of the CUDA path: the CPU backend, but attention sees and
// produces bf16 (supports(kAttention, kF32) is false, so ModelCompute casts around it exactly as
// it does for CUDA). Inside, the values are widened to f32 and the CPU's f32 attention runs.
class Bf16AttentionCpu final : public ForwardingBackend {
 public:
  std::string_view name() const override { return "cpu+bf16-attention"; }
  bool supports(kernels::OpKind op, DType dt) const override {
    if (op == kernels::OpKind::kAttention || op == kernels::OpKind::kAttentionBackward)
      return dt == DType::kBF16;
    return cpu().supports(op, dt);
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
