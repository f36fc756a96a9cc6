// SPDX-License-Identifier: Apache-2.0
// Bf16AttentionBackend: the CPU backend, but attention sees and produces bf16 as on CUDA
// (supports(kAttention / kAttentionBackward, kF32) is false, so ModelCompute casts q/k/v/out into
// its shared bf16 buffers exactly as it does for CUDA). Inside, the values are widened to f32, the
// CPU's f32 attention runs, and the results are rounded back. It counts the f32 -> bf16 converts
// (casts_down). Used as is by tests/unit/model/model_compute_keep_test.cpp and as the naive
// same-precision twin of the CUDA path (tests/gpu/bf16_attention_cpu.h); derived from where a test
// changes more (model_compute_attn_workspace_test.cpp: a CUDA-sized attention backward workspace).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "kernels/backend.h"
#include "unit/kernels/forwarding_backend.h"

namespace ferry::testing {

class Bf16AttentionBackend : public ForwardingBackend {
 public:
  std::string_view name() const override { return "cpu+bf16-attention"; }
  bool supports(kernels::OpKind op, DType dt) const override {
    if (op == kernels::OpKind::kAttention || op == kernels::OpKind::kAttentionBackward)
      return dt == DType::kBF16;
    return cpu().supports(op, dt);
  }
  Status convert(const kernels::ConvertArgs& a, mem::Stream& s) override {
    if (a.in.dtype == DType::kF32 && a.out.dtype == DType::kBF16) ++casts_down;
    return cpu().convert(a, s);
  }
  Status attention(const kernels::AttentionArgs& a, mem::Stream& s) override {
    std::vector<float> q = widened(a.q), k = widened(a.k), v = widened(a.v), out(numel(a.out));
    FERRY_TRY(cpu().attention({.out = f32(out, a.out),
                               .lse = a.lse,
                               .q = f32(q, a.q),
                               .k = f32(k, a.k),
                               .v = f32(v, a.v),
                               .cu_seqlens = a.cu_seqlens,
                               .scale = a.scale,
                               .causal = a.causal},
                              s));
    return narrow_into(out, a.out, s);
  }
  Status attention_backward(const kernels::AttentionBackwardArgs& a, mem::Stream& s) override {
    std::vector<float> q = widened(a.q), k = widened(a.k), v = widened(a.v), out = widened(a.out),
                       dout = widened(a.d_out), dq(numel(a.d_q)), dk(numel(a.d_k)),
                       dv(numel(a.d_v));
    FERRY_TRY(cpu().attention_backward({.d_q = f32(dq, a.d_q),
                                        .d_k = f32(dk, a.d_k),
                                        .d_v = f32(dv, a.d_v),
                                        .d_out = f32(dout, a.d_out),
                                        .q = f32(q, a.q),
                                        .k = f32(k, a.k),
                                        .v = f32(v, a.v),
                                        .out = f32(out, a.out),
                                        .lse = a.lse,
                                        .cu_seqlens = a.cu_seqlens,
                                        .scale = a.scale,
                                        .causal = a.causal},
                                       s));
    FERRY_TRY(narrow_into(dq, a.d_q, s));
    FERRY_TRY(narrow_into(dk, a.d_k, s));
    return narrow_into(dv, a.d_v, s);
  }

  int casts_down = 0;  // f32 -> bf16 converts

 protected:
  static kernels::Backend& cpu() { return kernels::cpu_backend(); }

 private:
  static std::size_t numel(const ConstTensorView& v) { return static_cast<std::size_t>(v.numel()); }
  // buf viewed with like's (contiguous) shape, in f32.
  static TensorView f32(std::vector<float>& buf, const ConstTensorView& like) {
    TensorView t;
    t.data = buf.data();
    t.dtype = DType::kF32;
    t.device = Device::kCpu;
    t.ndim = like.ndim;
    t.shape = like.shape;
    t.stride = like.stride;
    return t;
  }
  static std::vector<float> widened(const ConstTensorView& v) {
    std::vector<float> out(numel(v));
    EXPECT_TRUE(convert_elements(v.data, v.dtype, out.data(), DType::kF32, out.size()));
    return out;
  }
  static Status narrow_into(std::vector<float>& f, const TensorView& out, mem::Stream& s) {
    return cpu().convert({.out = out, .in = f32(f, out)}, s);
  }
};

}  // namespace ferry::testing
