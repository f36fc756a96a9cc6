// SPDX-License-Identifier: Apache-2.0
// CudaBackend: attention, router, MoE dispatch/combine and the fused chunked cross-entropy.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_util.h"

namespace ferry::kernels::cuda {
namespace {

constexpr std::initializer_list<DType> kBf16 = {DType::kBF16};

Status check_attention_common(const char* op, const ConstTensorView& q, const ConstTensorView& k,
                              const ConstTensorView& v, const ConstTensorView& cu, AttnShape* sh) {
  FERRY_TRY(need(op, "q", q, {-1, -1, -1}, kBf16));
  const std::int64_t t = q.shape[0], h = q.shape[1], d = q.shape[2];
  FERRY_TRY(need(op, "k", k, {t, -1, d}, kBf16));
  const std::int64_t g = k.shape[1];
  FERRY_TRY(need(op, "v", v, {t, g, d}, kBf16));
  FERRY_TRY(need(op, "cu_seqlens", cu, {-1}, kI32));
  if (g <= 0 || h % g != 0)
    return invalid_argument("cuda {}: {} query heads not a multiple of {} kv heads", op, h, g);
  if (cu.shape[0] < 1) return invalid_argument("cuda {}: cu_seqlens is empty", op);
  if (d != 16 && d != 32 && d != 64 && d != 128)
    return unimplemented("cuda {}: head dim {} (instantiated: 16, 32, 64, 128)", op, d);
  sh->t = t;
  sh->h = h;
  sh->g = g;
  sh->d = d;
  sh->s = cu.shape[0] - 1;
  return ok_status();
}

Status check_aligned16(const char* op, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (p != nullptr && (reinterpret_cast<std::uintptr_t>(p) & 15u) != 0)
      return unimplemented("cuda {}: tensors must be 16-byte aligned", op);
  return ok_status();
}

std::size_t align_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

}  // namespace

Status CudaBackend::attention(const AttentionArgs& a, Stream& stream) {
  constexpr const char* op = "attention";
  FERRY_TRY(check_stream(op, stream));
  AttnShape sh{};
  FERRY_TRY(check_attention_common(op, a.q, a.k, a.v, a.cu_seqlens, &sh));
  FERRY_TRY(need(op, "out", a.out, {sh.t, sh.h, sh.d}, kBf16));
  FERRY_TRY(maybe(op, "lse", a.lse, {sh.h, sh.t}, kF32));
  FERRY_TRY(check_aligned16(op, {a.q.data, a.k.data, a.v.data, a.out.data}));
  sh.scale = a.scale != 0.0f ? a.scale : static_cast<float>(1.0 / std::sqrt(double(sh.d)));
  sh.causal = a.causal;
  FERRY_LAUNCH_TRY(op, native(stream),
                   launch_attention_fwd(a.out.data, a.lse.as<float>(), a.q.data, a.k.data, a.v.data,
                                        a.cu_seqlens.as<std::int32_t>(), sh, native(stream)));
  return ok_status();
}

Status CudaBackend::attention_backward(const AttentionBackwardArgs& a, Stream& stream) {
  constexpr const char* op = "attention_backward";
  FERRY_TRY(check_stream(op, stream));
  AttnShape sh{};
  FERRY_TRY(check_attention_common(op, a.q, a.k, a.v, a.cu_seqlens, &sh));
  FERRY_TRY(need(op, "out", a.out, {sh.t, sh.h, sh.d}, kBf16));
  FERRY_TRY(need(op, "d_out", a.d_out, {sh.t, sh.h, sh.d}, kBf16));
  FERRY_TRY(need(op, "d_q", a.d_q, {sh.t, sh.h, sh.d}, kBf16));
  FERRY_TRY(need(op, "d_k", a.d_k, {sh.t, sh.g, sh.d}, kBf16));
  FERRY_TRY(need(op, "d_v", a.d_v, {sh.t, sh.g, sh.d}, kBf16));
  FERRY_TRY(need(op, "lse", a.lse, {sh.h, sh.t}, kF32));
  FERRY_TRY(check_aligned16(op, {a.q.data, a.k.data, a.v.data, a.out.data, a.d_out.data, a.d_q.data,
                                 a.d_k.data, a.d_v.data}));
  sh.scale = a.scale != 0.0f ? a.scale : static_cast<float>(1.0 / std::sqrt(double(sh.d)));
  sh.causal = a.causal;
  float* ws = nullptr;
  std::int64_t ws_floats = 0;
  if (!a.workspace.empty_view()) {
    if (a.workspace.device != Device::kCuda)
      return invalid_argument("cuda attention_backward: workspace is not device memory");
    FERRY_TRY(check_aligned16(op, {a.workspace.data}));
    ws = static_cast<float*>(a.workspace.data);
    ws_floats = static_cast<std::int64_t>(a.workspace.bytes() / sizeof(float));
  }
  FERRY_LAUNCH_TRY(
      op, native(stream),
      launch_attention_bwd(a.d_q.data, a.d_k.data, a.d_v.data, a.d_out.data, a.q.data, a.k.data,
                           a.v.data, a.out.data, a.lse.as<float>(), a.cu_seqlens.as<std::int32_t>(),
                           sh, ws, ws_floats, native(stream)));
  return ok_status();
}

std::size_t CudaBackend::workspace_bytes(const AttentionBackwardArgs& a) const {
  if (a.q.ndim != 3 || a.k.ndim != 3) return 0;
  return static_cast<std::size_t>(attention_bwd_workspace_floats(a.q.shape[0], a.q.shape[1],
                                                                 a.k.shape[1], a.q.shape[2])) *
         sizeof(float);
}

Status CudaBackend::router(const RouterArgs& a, Stream& stream) {
  constexpr const char* op = "router";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "logits", a.logits, {-1, -1}, kFloat));
  const std::int64_t t = a.logits.shape[0], e = a.logits.shape[1];
  const int k = a.top_k;
  if (k < 1 || k > e || k > 32)
    return invalid_argument("cuda router: top_k {} outside [1, min(E={}, 32)]", k, e);
  FERRY_TRY(need(op, "weights", a.weights, {t, k}, kF32));
  FERRY_TRY(need(op, "ids", a.ids, {t, k}, kI32));
  FERRY_TRY(need(op, "probs", a.probs, {t, e}, kF32));
  FERRY_LAUNCH_TRY(
      op, native(stream),
      launch_router(elt(a.logits.dtype), a.weights.as<float>(), a.ids.as<std::int32_t>(),
                    a.probs.as<float>(), a.logits.data, t, e, k, a.renormalize, native(stream)));
  return ok_status();
}

Status CudaBackend::router_backward(const RouterBackwardArgs& a, Stream& stream) {
  constexpr const char* op = "router_backward";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "probs", a.probs, {-1, -1}, kF32));
  const std::int64_t t = a.probs.shape[0], e = a.probs.shape[1];
  const int k = a.top_k;
  if (k < 1 || k > e) return invalid_argument("cuda router_backward: top_k {} vs E {}", k, e);
  FERRY_TRY(need(op, "d_logits", a.d_logits, {t, e}, kFloat));
  FERRY_TRY(need(op, "d_weights", a.d_weights, {t, k}, kF32));
  FERRY_TRY(need(op, "ids", a.ids, {t, k}, kI32));
  FERRY_LAUNCH_TRY(
      op, native(stream),
      launch_router_backward(elt(a.d_logits.dtype), a.d_logits.data, a.d_weights.as<float>(),
                             a.probs.as<float>(), a.ids.as<std::int32_t>(), t, e, k, a.renormalize,
                             native(stream)));
  return ok_status();
}

Status CudaBackend::moe_dispatch(const MoeDispatchArgs& a, Stream& stream) {
  constexpr const char* op = "moe_dispatch";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "x", a.x, {-1, -1}, kFloat));
  const std::int64_t t = a.x.shape[0], c = a.x.shape[1];
  FERRY_TRY(need(op, "ids", a.ids, {t, -1}, kI32));
  const std::int64_t k = a.ids.shape[1];
  const std::int64_t e = a.num_experts;
  if (e < 1) return invalid_argument("cuda moe_dispatch: num_experts {} < 1", e);
  FERRY_TRY(need(op, "gathered", a.gathered, {t * k, c}, {a.x.dtype}));
  FERRY_TRY(need(op, "expert_offsets", a.expert_offsets, {e + 1}, kI32));
  FERRY_TRY(need(op, "slot_of", a.slot_of, {t, k}, kI32));
  FERRY_LAUNCH_TRY(
      op, native(stream),
      launch_moe_dispatch(elt(a.x.dtype), a.gathered.data, a.expert_offsets.as<std::int32_t>(),
                          a.slot_of.as<std::int32_t>(), a.x.data, a.ids.as<std::int32_t>(), t, k, c,
                          e, native(stream)));
  return ok_status();
}

Status CudaBackend::moe_dispatch_backward(const MoeDispatchBackwardArgs& a, Stream& stream) {
  constexpr const char* op = "moe_dispatch_backward";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "d_x", a.d_x, {-1, -1}, kFloat));
  const std::int64_t t = a.d_x.shape[0], c = a.d_x.shape[1];
  FERRY_TRY(need(op, "slot_of", a.slot_of, {t, -1}, kI32));
  const std::int64_t k = a.slot_of.shape[1];
  FERRY_TRY(need(op, "d_gathered", a.d_gathered, {t * k, c}, {a.d_x.dtype}));
  FERRY_LAUNCH_TRY(
      op, native(stream),
      launch_moe_dispatch_backward(elt(a.d_x.dtype), a.d_x.data, a.d_gathered.data,
                                   a.slot_of.as<std::int32_t>(), t, k, c, native(stream)));
  return ok_status();
}

Status CudaBackend::moe_combine(const MoeCombineArgs& a, Stream& stream) {
  constexpr const char* op = "moe_combine";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "out", a.out, {-1, -1}, kFloat));
  const std::int64_t t = a.out.shape[0], c = a.out.shape[1];
  FERRY_TRY(need(op, "slot_of", a.slot_of, {t, -1}, kI32));
  const std::int64_t k = a.slot_of.shape[1];
  FERRY_TRY(need(op, "weights", a.weights, {t, k}, kF32));
  FERRY_TRY(need(op, "expert_out", a.expert_out, {t * k, c}, {a.out.dtype}));
  FERRY_LAUNCH_TRY(
      op, native(stream),
      launch_moe_combine(elt(a.out.dtype), a.out.data, a.expert_out.data, a.weights.as<float>(),
                         a.slot_of.as<std::int32_t>(), t, k, c, native(stream)));
  return ok_status();
}

Status CudaBackend::moe_combine_backward(const MoeCombineBackwardArgs& a, Stream& stream) {
  constexpr const char* op = "moe_combine_backward";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "d_out", a.d_out, {-1, -1}, kFloat));
  const std::int64_t t = a.d_out.shape[0], c = a.d_out.shape[1];
  FERRY_TRY(need(op, "slot_of", a.slot_of, {t, -1}, kI32));
  const std::int64_t k = a.slot_of.shape[1];
  const DType dt = a.d_out.dtype;
  FERRY_TRY(need(op, "weights", a.weights, {t, k}, kF32));
  FERRY_TRY(need(op, "expert_out", a.expert_out, {t * k, c}, {dt}));
  FERRY_TRY(need(op, "d_expert_out", a.d_expert_out, {t * k, c}, {dt}));
  FERRY_TRY(need(op, "d_weights", a.d_weights, {t, k}, kF32));
  FERRY_LAUNCH_TRY(
      op, native(stream),
      launch_moe_combine_backward(elt(dt), a.d_expert_out.data, a.d_weights.as<float>(),
                                  a.d_out.data, a.expert_out.data, a.weights.as<float>(),
                                  a.slot_of.as<std::int32_t>(), t, k, c, native(stream)));
  return ok_status();
}

// Workspace: f32 logits [chunk, V] (+ d_logits [chunk, V] in the weight dtype when gradients are
// wanted), each region 256-byte aligned.
std::size_t CudaBackend::workspace_bytes(const CrossEntropyArgs& a) const {
  if (a.hidden.ndim != 2 || a.weight.ndim != 2) return 0;
  const std::int64_t t = a.hidden.shape[0], v = a.weight.shape[0];
  const std::int64_t chunk = std::max<std::int64_t>(1, std::min<std::int64_t>(a.chunk_tokens, t));
  std::size_t bytes = align_up(static_cast<std::size_t>(chunk * v) * 4, 256);
  if (a.d_hidden.data != nullptr || a.d_weight.data != nullptr)
    bytes += align_up(static_cast<std::size_t>(chunk * v) * dtype_size(a.weight.dtype), 256);
  return bytes + 256;
}

Status CudaBackend::cross_entropy(const CrossEntropyArgs& a, Stream& stream) {
  constexpr const char* op = "cross_entropy";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "hidden", a.hidden, {-1, -1}, kFloat));
  const std::int64_t t = a.hidden.shape[0], c = a.hidden.shape[1];
  const DType dt = a.hidden.dtype;
  FERRY_TRY(need(op, "weight", a.weight, {-1, c}, {dt}));
  const std::int64_t v = a.weight.shape[0];
  FERRY_TRY(need(op, "targets", a.targets, {t}, kI32));
  FERRY_TRY(need(op, "nll", a.nll, {t}, kF32));
  const std::initializer_list<DType> grad_types =
      dt == DType::kBF16 ? kFloat : std::initializer_list<DType>{DType::kF32};
  FERRY_TRY(maybe(op, "d_hidden", a.d_hidden, {t, c}, grad_types));
  FERRY_TRY(maybe(op, "d_weight", a.d_weight, {v, c}, grad_types));
  if (a.workspace.data == nullptr) return invalid_argument("cuda cross_entropy: no workspace");
  const std::size_t need_bytes = workspace_bytes(a);
  if (a.workspace.bytes() < need_bytes)
    return invalid_argument("cuda cross_entropy: workspace {} bytes, need {}", a.workspace.bytes(),
                            need_bytes);
  if (t == 0) return ok_status();
  const bool grads = a.d_hidden.data != nullptr || a.d_weight.data != nullptr;
  const std::int64_t chunk = std::max<std::int64_t>(1, std::min<std::int64_t>(a.chunk_tokens, t));
  auto* base = reinterpret_cast<std::byte*>(
      align_up(reinterpret_cast<std::uintptr_t>(a.workspace.data), 256));
  float* logits = reinterpret_cast<float*>(base);
  void* d_logits = grads ? base + align_up(static_cast<std::size_t>(chunk * v) * 4, 256) : nullptr;
  const cudaDataType_t ab = dt == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  const std::size_t esz = dtype_size(dt);
  const cudaStream_t s = native(stream);
  FERRY_CUDA_TRY(cudaSetDevice(device_));
  for (std::int64_t r0 = 0; r0 < t; r0 += chunk) {
    const std::int64_t n = std::min(chunk, t - r0);
    const auto* h_rows = static_cast<const std::byte*>(a.hidden.data) + r0 * c * esz;
    // logits [n, V] = hidden[r0:r0+n] @ weight^T
    GemmProblem p1{n, v, c, false, true, ab, CUDA_R_32F, c, c, v, false};
    FERRY_TRY(gemm_.run(p1, h_rows, a.weight.data, logits, nullptr, 1.0f, 0.0f, s));
    FERRY_LAUNCH_TRY(
        op, s,
        launch_ce_rows(a.nll.as<float>() + r0, d_logits, elt(dt), logits,
                       a.targets.as<std::int32_t>() + r0, n, v, a.ignore_index, a.grad_scale, s));
    if (a.d_hidden.data != nullptr) {
      // d_hidden[r0:r0+n] [n, C] = d_logits [n, V] @ weight [V, C]
      const cudaDataType_t ot = a.d_hidden.dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
      GemmProblem p2{n, c, v, false, false, ab, ot, v, c, c, false};
      auto* dst = static_cast<std::byte*>(a.d_hidden.data) + r0 * c * dtype_size(a.d_hidden.dtype);
      FERRY_TRY(gemm_.run(p2, d_logits, a.weight.data, dst, nullptr, 1.0f, 0.0f, s));
    }
    if (a.d_weight.data != nullptr) {
      // d_weight [V, C] += d_logits^T [V, n] @ hidden[r0:r0+n] [n, C]
      const cudaDataType_t ot = a.d_weight.dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
      GemmProblem p3{v, c, n, true, false, ab, ot, v, c, c, false};
      FERRY_TRY(gemm_.run(p3, d_logits, h_rows, a.d_weight.data, nullptr, 1.0f, 1.0f, s));
    }
  }
  return ok_status();
}

}  // namespace ferry::kernels::cuda
