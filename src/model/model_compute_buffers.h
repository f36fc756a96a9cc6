// SPDX-License-Identifier: Apache-2.0
// Internal to model_compute*.cpp: the activation buffers ModelCompute plans at construction
// (llm.c's "size table, then one allocation", one vector per tensor for readability) and small
// view helpers. Host memory only (see model_compute.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "model/model_compute.h"

namespace ferry::model::detail {

// Tokens per logits chunk of the fused lm_head + cross-entropy (forward and backward must agree,
// since the workspace is sized for it).
inline constexpr int kCeChunkTokens = 128;
inline kernels::Stream& host() { return kernels::Stream::host(); }

inline TensorView f32_view(std::vector<float>& buf, std::initializer_list<std::int64_t> dims) {
  return TensorView::contiguous(buf.data(), DType::kF32, Device::kCpu, dims);
}
inline TensorView i32_view(std::vector<std::int32_t>& buf,
                           std::initializer_list<std::int64_t> dims) {
  return TensorView::contiguous(buf.data(), DType::kI32, Device::kCpu, dims);
}

// Rows [r0, r1) of a row-major 2-D view.
inline TensorView rows_of(const TensorView& v, std::int64_t r0, std::int64_t r1) {
  TensorView out = v;
  out.data = static_cast<std::byte*>(v.data) + r0 * v.stride[0] * std::int64_t(dtype_size(v.dtype));
  out.shape[0] = r1 - r0;
  return out;
}
inline ConstTensorView rows_of(const ConstTensorView& v, std::int64_t r0, std::int64_t r1) {
  ConstTensorView out = v;
  out.data =
      static_cast<const std::byte*>(v.data) + r0 * v.stride[0] * std::int64_t(dtype_size(v.dtype));
  out.shape[0] = r1 - r0;
  return out;
}

// Reinterprets a contiguous view with new dims (same element count).
template <typename View>
View reshaped(const View& v, std::initializer_list<std::int64_t> dims) {
  View out = View::contiguous(v.data, v.dtype, v.device, dims);
  FERRY_CHECK(out.numel() == v.numel(), "model: reshape {} -> {} changes size", v.shape_string(),
              out.shape_string());
  return out;
}

inline void zero_host(const TensorView& v) { std::memset(v.data, 0, v.bytes()); }

}  // namespace ferry::model::detail

namespace ferry::model {

struct ModelCompute::LayerActs {
  std::vector<float> x_in;     // [T, C] residual stream entering the layer
  std::vector<float> h1;       // [T, C] attn_norm output
  std::vector<float> rstd1;    // [T]
  std::vector<float> q_pre;    // [T, H*D] projection output before q/k norm (when normed)
  std::vector<float> k_pre;    // [T, G*D]
  std::vector<float> q_rstd;   // [T*H] or [T]
  std::vector<float> k_rstd;   // [T*G] or [T]
  std::vector<float> q, k, v;  // [T, H*D], [T, G*D], [T, G*D] after norm + rope
  std::vector<float> attn;     // [T, H*D]
  std::vector<float> lse;      // [H, T]
  std::vector<float> x_mid;    // [T, C] after the attention residual
  std::vector<float> h2;       // [T, C] mlp_norm output
  std::vector<float> rstd2;    // [T]
  // dense MLP
  std::vector<float> gate, up, act;  // [T, F]
  // MoE
  std::vector<float> router_logits, probs;  // [T, E]
  std::vector<float> weights;               // [T, K]
  std::vector<std::int32_t> ids, slot_of;   // [T, K]
  std::vector<std::int32_t> offsets;        // [E + 1]
  std::vector<float> gathered;              // [T*K, C]
  std::vector<float> egate, eup, eact;      // [T*K, Fe]
  std::vector<float> eout;                  // [T*K, C]
};

struct ModelCompute::Scratch {
  std::vector<float> x_final, hf, rstd_f;  // [T, C], [T, C], [T]
  std::vector<float> nll;                  // [T]
  std::vector<std::uint8_t> ce_workspace;
  std::vector<float> ones;                    // [T] of 1.0 (bias gradients as a GEMM)
  std::vector<float> tmp_c;                   // [T, C]
  std::vector<float> dx, dx_mid, dh;          // [T, C]
  std::vector<float> dq, dk, dv;              // [T, H*D], [T, G*D], [T, G*D]
  std::vector<float> dq_pre, dk_pre;          // same
  std::vector<float> d_attn;                  // [T, H*D]
  std::vector<float> d_act, d_gate, d_up;     // [T, F]
  std::vector<float> d_eout, d_gathered;      // [T*K, C]
  std::vector<float> d_eact, d_egate, d_eup;  // [T*K, Fe]
  std::vector<float> d_weights;               // [T, K]
  std::vector<float> d_router_logits;         // [T, E]
};

}  // namespace ferry::model
