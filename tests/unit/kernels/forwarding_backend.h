// SPDX-License-Identifier: Apache-2.0
// ForwardingBackend: a test Backend that hands every op to another backend (the CPU backend by
// default). Test doubles derive from it and override only the ops they change (e.g. attention in
// bf16 as the CUDA path sees it: tests/gpu/bf16_attention_cpu.h,
// tests/unit/model/model_compute_attn_workspace_test.cpp).
#pragma once

#include <cstddef>
#include <string_view>

#include "kernels/backend.h"

namespace ferry::testing {

class ForwardingBackend : public kernels::Backend {
 public:
  explicit ForwardingBackend(kernels::Backend& target = kernels::cpu_backend()) : t_(target) {}

  std::string_view name() const override { return t_.name(); }
  Device device() const override { return t_.device(); }
  bool supports(kernels::OpKind op, DType dt) const override { return t_.supports(op, dt); }
  std::size_t workspace_bytes(const kernels::CrossEntropyArgs& a) const override {
    return t_.workspace_bytes(a);
  }
  std::size_t workspace_bytes(const kernels::AttentionBackwardArgs& a) const override {
    return t_.workspace_bytes(a);
  }
  std::size_t workspace_bytes(const kernels::SumSquaresArgs& a) const override {
    return t_.workspace_bytes(a);
  }
  Status gemm(const kernels::GemmArgs& a, mem::Stream& s) override { return t_.gemm(a, s); }
  Status embedding(const kernels::EmbeddingArgs& a, mem::Stream& s) override {
    return t_.embedding(a, s);
  }
  Status embedding_backward(const kernels::EmbeddingBackwardArgs& a, mem::Stream& s) override {
    return t_.embedding_backward(a, s);
  }
  Status rms_norm(const kernels::RmsNormArgs& a, mem::Stream& s) override {
    return t_.rms_norm(a, s);
  }
  Status rms_norm_backward(const kernels::RmsNormBackwardArgs& a, mem::Stream& s) override {
    return t_.rms_norm_backward(a, s);
  }
  Status rope(const kernels::RopeArgs& a, mem::Stream& s) override { return t_.rope(a, s); }
  Status attention(const kernels::AttentionArgs& a, mem::Stream& s) override {
    return t_.attention(a, s);
  }
  Status attention_backward(const kernels::AttentionBackwardArgs& a, mem::Stream& s) override {
    return t_.attention_backward(a, s);
  }
  Status swiglu(const kernels::SwiGluArgs& a, mem::Stream& s) override { return t_.swiglu(a, s); }
  Status swiglu_backward(const kernels::SwiGluBackwardArgs& a, mem::Stream& s) override {
    return t_.swiglu_backward(a, s);
  }
  Status add(const kernels::AddArgs& a, mem::Stream& s) override { return t_.add(a, s); }
  Status router(const kernels::RouterArgs& a, mem::Stream& s) override { return t_.router(a, s); }
  Status router_backward(const kernels::RouterBackwardArgs& a, mem::Stream& s) override {
    return t_.router_backward(a, s);
  }
  Status moe_dispatch(const kernels::MoeDispatchArgs& a, mem::Stream& s) override {
    return t_.moe_dispatch(a, s);
  }
  Status moe_dispatch_backward(const kernels::MoeDispatchBackwardArgs& a, mem::Stream& s) override {
    return t_.moe_dispatch_backward(a, s);
  }
  Status moe_combine(const kernels::MoeCombineArgs& a, mem::Stream& s) override {
    return t_.moe_combine(a, s);
  }
  Status moe_combine_backward(const kernels::MoeCombineBackwardArgs& a, mem::Stream& s) override {
    return t_.moe_combine_backward(a, s);
  }
  Status cross_entropy(const kernels::CrossEntropyArgs& a, mem::Stream& s) override {
    return t_.cross_entropy(a, s);
  }
  Status adamw(const kernels::AdamWArgs& a, mem::Stream& s) override { return t_.adamw(a, s); }
  Status sum_squares(const kernels::SumSquaresArgs& a, mem::Stream& s) override {
    return t_.sum_squares(a, s);
  }
  Status convert(const kernels::ConvertArgs& a, mem::Stream& s) override {
    return t_.convert(a, s);
  }
  Status hybrid_adamw(const kernels::HybridAdamWArgs& a, mem::Stream& s) override {
    return t_.hybrid_adamw(a, s);
  }

 protected:
  kernels::Backend& target() const { return t_; }

 private:
  kernels::Backend& t_;
};

}  // namespace ferry::testing
