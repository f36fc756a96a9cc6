// SPDX-License-Identifier: Apache-2.0
// Validation for attention / router / MoE dispatch+combine / fused cross-entropy arguments
// (see attn_moe_ce_checks.h for the policy). Messages: "kernels: <op>: <view> <what>".
#include "kernels/attn_moe_ce_checks.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <string_view>

namespace ferry::kernels::detail {
namespace {

enum class Kind : std::uint8_t { kFloatIn, kFloatOut, kI32, kU8 };

bool present(const ConstTensorView& v) { return v.data != nullptr || v.ndim > 0; }

std::string dims_string(std::initializer_list<std::int64_t> want) {
  std::string s = "[";
  bool first = true;
  for (auto d : want) {
    s += (first ? "" : ", ") + std::to_string(d);
    first = false;
  }
  return s + "]";
}

bool dtype_ok(DType dt, Kind kind, FloatSet fs) {
  switch (kind) {
    case Kind::kI32:
      return dt == DType::kI32;
    case Kind::kU8:
      return dt == DType::kU8;
    case Kind::kFloatIn:
      if (fs == FloatSet::kF32) return dt == DType::kF32;
      return dt == DType::kF32 || dt == DType::kF64 || dt == DType::kBF16;
    case Kind::kFloatOut:
      if (fs == FloatSet::kF32) return dt == DType::kF32;
      return dt == DType::kF32 || dt == DType::kF64;
  }
  return false;
}

// Checks that a required view is present, on the host, contiguous, of an accepted dtype and of
// exactly the wanted shape.
Status expect(const ConstTensorView& v, std::string_view op, std::string_view name, Kind kind,
              FloatSet fs, std::initializer_list<std::int64_t> want) {
  if (!present(v)) return invalid_argument("kernels: {}: {} is missing", op, name);
  if (v.device != Device::kCpu) {
    return unimplemented("kernels: {}: {} is on {}, this backend runs on the host", op, name,
                         to_string(v.device));
  }
  if (!dtype_ok(v.dtype, kind, fs)) {
    const bool is_float_kind = kind == Kind::kFloatIn || kind == Kind::kFloatOut;
    if (is_float_kind && is_float(v.dtype)) {
      return unimplemented("kernels: {}: {} dtype {} not supported by this backend", op, name,
                           to_string(v.dtype));
    }
    return invalid_argument("kernels: {}: {} has dtype {}, wrong kind", op, name,
                            to_string(v.dtype));
  }
  bool same = v.ndim == static_cast<int>(want.size());
  int i = 0;
  for (auto d : want) {
    if (!same) break;
    same = v.shape[i++] == d;
  }
  if (!same) {
    return invalid_argument("kernels: {}: {} must be {}, got {}", op, name, dims_string(want),
                            v.shape_string());
  }
  if (!v.is_contiguous()) return unimplemented("kernels: {}: {} is not contiguous", op, name);
  if (v.data == nullptr && v.numel() > 0) {
    return invalid_argument("kernels: {}: {} has a null data pointer", op, name);
  }
  return ok_status();
}

Status expect_optional(const ConstTensorView& v, std::string_view op, std::string_view name,
                       Kind kind, FloatSet fs, std::initializer_list<std::int64_t> want) {
  return present(v) ? expect(v, op, name, kind, fs, want) : ok_status();
}

Status expect_ndim(const ConstTensorView& v, std::string_view op, std::string_view name, int ndim) {
  if (!present(v)) return invalid_argument("kernels: {}: {} is missing", op, name);
  if (v.ndim != ndim) {
    return invalid_argument("kernels: {}: {} must have {} dims, got {}", op, name, ndim,
                            v.shape_string());
  }
  return ok_status();
}

Status check_cu_seqlens(const ConstTensorView& cu, std::string_view op, std::int64_t T) {
  FERRY_TRY(expect_ndim(cu, op, "cu_seqlens", 1));
  if (cu.shape[0] < 1) return invalid_argument("kernels: {}: cu_seqlens needs >= 1 entry", op);
  FERRY_TRY(expect(cu, op, "cu_seqlens", Kind::kI32, FloatSet::kF32, {cu.shape[0]}));
  const std::int64_t n = cu.shape[0];
  const auto* c = cu.as<std::int32_t>();
  if (c[0] != 0) return invalid_argument("kernels: {}: cu_seqlens[0] = {}, must be 0", op, c[0]);
  for (std::int64_t s = 1; s < n; ++s) {
    if (c[s] < c[s - 1]) {
      return invalid_argument("kernels: {}: cu_seqlens decreases at {} ({} < {})", op, s, c[s],
                              c[s - 1]);
    }
  }
  if (c[n - 1] != T) {
    return invalid_argument("kernels: {}: cu_seqlens[{}] = {}, must equal T = {}", op, n - 1,
                            c[n - 1], T);
  }
  return ok_status();
}

Result<double> resolve_scale(float scale, std::int64_t D, std::string_view op) {
  if (!std::isfinite(scale)) return invalid_argument("kernels: {}: scale is not finite", op);
  return scale == 0.0f ? 1.0 / std::sqrt(static_cast<double>(D)) : static_cast<double>(scale);
}

// ids [T, K] i32, each in [0, E); when distinct, no id twice in a row.
Status check_ids(const ConstTensorView& ids, std::string_view op, std::int64_t E, bool distinct) {
  const std::int64_t T = ids.shape[0], K = ids.shape[1];
  const auto* p = ids.as<std::int32_t>();
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t k = 0; k < K; ++k) {
      const std::int32_t e = p[t * K + k];
      if (e < 0 || e >= E) {
        return invalid_argument("kernels: {}: ids[{}, {}] = {} outside [0, {})", op, t, k, e, E);
      }
      for (std::int64_t j = 0; distinct && j < k; ++j) {
        if (p[t * K + j] == e) {
          return invalid_argument("kernels: {}: expert {} appears twice in ids row {}", op, e, t);
        }
      }
    }
  }
  return ok_status();
}

// slot_of [T, K] i32, each in [0, T*K).
Status check_slots(const ConstTensorView& slot_of, std::string_view op) {
  const std::int64_t n = slot_of.numel();
  const auto* p = slot_of.as<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    if (p[i] < 0 || p[i] >= n) {
      return invalid_argument("kernels: {}: slot_of[{}] = {} outside [0, {})", op, i, p[i], n);
    }
  }
  return ok_status();
}

}  // namespace

Result<AttentionDims> check_attention(const AttentionArgs& a, FloatSet fs) {
  constexpr std::string_view op = "attention";
  FERRY_TRY(expect_ndim(a.q, op, "q", 3));
  FERRY_TRY(expect_ndim(a.k, op, "k", 3));
  AttentionDims d;
  d.T = a.q.shape[0];
  d.H = a.q.shape[1];
  d.D = a.q.shape[2];
  d.G = a.k.shape[1];
  if (d.D < 1 || d.G < 1 || d.H % d.G != 0) {
    return invalid_argument("kernels: attention: need D >= 1 and H % G == 0, got H={} G={} D={}",
                            d.H, d.G, d.D);
  }
  FERRY_TRY(expect(a.q, op, "q", Kind::kFloatIn, fs, {d.T, d.H, d.D}));
  FERRY_TRY(expect(a.k, op, "k", Kind::kFloatIn, fs, {d.T, d.G, d.D}));
  FERRY_TRY(expect(a.v, op, "v", Kind::kFloatIn, fs, {d.T, d.G, d.D}));
  FERRY_TRY(expect(a.out, op, "out", Kind::kFloatOut, fs, {d.T, d.H, d.D}));
  FERRY_TRY(expect_optional(a.lse, op, "lse", Kind::kFloatOut, fs, {d.H, d.T}));
  FERRY_TRY(check_cu_seqlens(a.cu_seqlens, op, d.T));
  d.S = a.cu_seqlens.shape[0] - 1;
  FERRY_ASSIGN_OR_RETURN(d.scale, resolve_scale(a.scale, d.D, op));
  return d;
}

Result<AttentionDims> check_attention_backward(const AttentionBackwardArgs& a, FloatSet fs) {
  constexpr std::string_view op = "attention_backward";
  FERRY_TRY(expect_ndim(a.q, op, "q", 3));
  FERRY_TRY(expect_ndim(a.k, op, "k", 3));
  AttentionDims d;
  d.T = a.q.shape[0];
  d.H = a.q.shape[1];
  d.D = a.q.shape[2];
  d.G = a.k.shape[1];
  if (d.D < 1 || d.G < 1 || d.H % d.G != 0) {
    return invalid_argument(
        "kernels: attention_backward: need D >= 1 and H % G == 0, got H={} G={} D={}", d.H, d.G,
        d.D);
  }
  FERRY_TRY(expect(a.q, op, "q", Kind::kFloatIn, fs, {d.T, d.H, d.D}));
  FERRY_TRY(expect(a.k, op, "k", Kind::kFloatIn, fs, {d.T, d.G, d.D}));
  FERRY_TRY(expect(a.v, op, "v", Kind::kFloatIn, fs, {d.T, d.G, d.D}));
  FERRY_TRY(expect(a.out, op, "out", Kind::kFloatIn, fs, {d.T, d.H, d.D}));
  FERRY_TRY(expect(a.d_out, op, "d_out", Kind::kFloatIn, fs, {d.T, d.H, d.D}));
  FERRY_TRY(expect(a.lse, op, "lse", Kind::kFloatIn, fs, {d.H, d.T}));
  FERRY_TRY(expect(a.d_q, op, "d_q", Kind::kFloatOut, fs, {d.T, d.H, d.D}));
  FERRY_TRY(expect(a.d_k, op, "d_k", Kind::kFloatOut, fs, {d.T, d.G, d.D}));
  FERRY_TRY(expect(a.d_v, op, "d_v", Kind::kFloatOut, fs, {d.T, d.G, d.D}));
  FERRY_TRY(check_cu_seqlens(a.cu_seqlens, op, d.T));
  d.S = a.cu_seqlens.shape[0] - 1;
  FERRY_ASSIGN_OR_RETURN(d.scale, resolve_scale(a.scale, d.D, op));
  return d;
}

Result<RouterDims> check_router(const RouterArgs& a, FloatSet fs) {
  constexpr std::string_view op = "router";
  FERRY_TRY(expect_ndim(a.logits, op, "logits", 2));
  RouterDims d{a.logits.shape[0], a.logits.shape[1], a.top_k};
  if (d.E < 1 || d.K < 1 || d.K > d.E) {
    return invalid_argument("kernels: router: need 1 <= top_k <= E, got top_k={} E={}", d.K, d.E);
  }
  FERRY_TRY(expect(a.logits, op, "logits", Kind::kFloatIn, fs, {d.T, d.E}));
  FERRY_TRY(expect(a.weights, op, "weights", Kind::kFloatOut, fs, {d.T, d.K}));
  FERRY_TRY(expect(a.ids, op, "ids", Kind::kI32, fs, {d.T, d.K}));
  FERRY_TRY(expect(a.probs, op, "probs", Kind::kFloatOut, fs, {d.T, d.E}));
  // A NaN or +inf logit has no softmax; a row of -inf has no probability mass.
  for (std::int64_t t = 0; t < d.T; ++t) {
    bool any_finite = false;
    for (std::int64_t e = 0; e < d.E; ++e) {
      const double x = load(a.logits, t * d.E + e);
      if (std::isnan(x) || x == INFINITY) {
        return invalid_argument("kernels: router: logits[{}, {}] is {}", t, e, x);
      }
      any_finite = any_finite || x != -INFINITY;
    }
    if (!any_finite) return invalid_argument("kernels: router: logits row {} is all -inf", t);
  }
  return d;
}

Result<RouterDims> check_router_backward(const RouterBackwardArgs& a, FloatSet fs) {
  constexpr std::string_view op = "router_backward";
  FERRY_TRY(expect_ndim(a.probs, op, "probs", 2));
  RouterDims d{a.probs.shape[0], a.probs.shape[1], a.top_k};
  if (d.E < 1 || d.K < 1 || d.K > d.E) {
    return invalid_argument("kernels: router_backward: need 1 <= top_k <= E, got top_k={} E={}",
                            d.K, d.E);
  }
  FERRY_TRY(expect(a.probs, op, "probs", Kind::kFloatIn, fs, {d.T, d.E}));
  FERRY_TRY(expect(a.d_weights, op, "d_weights", Kind::kFloatIn, fs, {d.T, d.K}));
  FERRY_TRY(expect(a.ids, op, "ids", Kind::kI32, fs, {d.T, d.K}));
  FERRY_TRY(expect(a.d_logits, op, "d_logits", Kind::kFloatOut, fs, {d.T, d.E}));
  FERRY_TRY(check_ids(a.ids, op, d.E, /*distinct=*/true));
  return d;
}

Result<MoeDims> check_moe_dispatch(const MoeDispatchArgs& a, FloatSet fs) {
  constexpr std::string_view op = "moe_dispatch";
  FERRY_TRY(expect_ndim(a.x, op, "x", 2));
  FERRY_TRY(expect_ndim(a.ids, op, "ids", 2));
  MoeDims d{a.x.shape[0], a.ids.shape[1], a.x.shape[1], a.num_experts};
  if (d.E < 1) return invalid_argument("kernels: moe_dispatch: num_experts = {} < 1", d.E);
  FERRY_TRY(expect(a.x, op, "x", Kind::kFloatIn, fs, {d.T, d.C}));
  FERRY_TRY(expect(a.ids, op, "ids", Kind::kI32, fs, {d.T, d.K}));
  FERRY_TRY(expect(a.gathered, op, "gathered", Kind::kFloatOut, fs, {d.T * d.K, d.C}));
  FERRY_TRY(expect(a.expert_offsets, op, "expert_offsets", Kind::kI32, fs, {d.E + 1}));
  FERRY_TRY(expect(a.slot_of, op, "slot_of", Kind::kI32, fs, {d.T, d.K}));
  FERRY_TRY(check_ids(a.ids, op, d.E, /*distinct=*/false));
  return d;
}

Result<MoeDims> check_moe_dispatch_backward(const MoeDispatchBackwardArgs& a, FloatSet fs) {
  constexpr std::string_view op = "moe_dispatch_backward";
  FERRY_TRY(expect_ndim(a.d_x, op, "d_x", 2));
  FERRY_TRY(expect_ndim(a.slot_of, op, "slot_of", 2));
  MoeDims d{a.d_x.shape[0], a.slot_of.shape[1], a.d_x.shape[1], 0};
  FERRY_TRY(expect(a.d_x, op, "d_x", Kind::kFloatOut, fs, {d.T, d.C}));
  FERRY_TRY(expect(a.d_gathered, op, "d_gathered", Kind::kFloatIn, fs, {d.T * d.K, d.C}));
  FERRY_TRY(expect(a.slot_of, op, "slot_of", Kind::kI32, fs, {d.T, d.K}));
  FERRY_TRY(check_slots(a.slot_of, op));
  return d;
}

Result<MoeDims> check_moe_combine(const MoeCombineArgs& a, FloatSet fs) {
  constexpr std::string_view op = "moe_combine";
  FERRY_TRY(expect_ndim(a.out, op, "out", 2));
  FERRY_TRY(expect_ndim(a.slot_of, op, "slot_of", 2));
  MoeDims d{a.out.shape[0], a.slot_of.shape[1], a.out.shape[1], 0};
  FERRY_TRY(expect(a.out, op, "out", Kind::kFloatOut, fs, {d.T, d.C}));
  FERRY_TRY(expect(a.expert_out, op, "expert_out", Kind::kFloatIn, fs, {d.T * d.K, d.C}));
  FERRY_TRY(expect(a.weights, op, "weights", Kind::kFloatIn, fs, {d.T, d.K}));
  FERRY_TRY(expect(a.slot_of, op, "slot_of", Kind::kI32, fs, {d.T, d.K}));
  FERRY_TRY(check_slots(a.slot_of, op));
  return d;
}

Result<MoeDims> check_moe_combine_backward(const MoeCombineBackwardArgs& a, FloatSet fs) {
  constexpr std::string_view op = "moe_combine_backward";
  FERRY_TRY(expect_ndim(a.d_out, op, "d_out", 2));
  FERRY_TRY(expect_ndim(a.slot_of, op, "slot_of", 2));
  MoeDims d{a.d_out.shape[0], a.slot_of.shape[1], a.d_out.shape[1], 0};
  FERRY_TRY(expect(a.d_out, op, "d_out", Kind::kFloatIn, fs, {d.T, d.C}));
  FERRY_TRY(expect(a.expert_out, op, "expert_out", Kind::kFloatIn, fs, {d.T * d.K, d.C}));
  FERRY_TRY(expect(a.weights, op, "weights", Kind::kFloatIn, fs, {d.T, d.K}));
  FERRY_TRY(expect(a.slot_of, op, "slot_of", Kind::kI32, fs, {d.T, d.K}));
  FERRY_TRY(expect(a.d_expert_out, op, "d_expert_out", Kind::kFloatOut, fs, {d.T * d.K, d.C}));
  FERRY_TRY(expect(a.d_weights, op, "d_weights", Kind::kFloatOut, fs, {d.T, d.K}));
  FERRY_TRY(check_slots(a.slot_of, op));
  return d;
}

std::int64_t cross_entropy_chunk_rows(const CrossEntropyArgs& a) {
  if (a.hidden.ndim != 2 || a.chunk_tokens < 1) return 0;
  const std::int64_t T = a.hidden.shape[0];
  return T < a.chunk_tokens ? T : a.chunk_tokens;
}

Result<CrossEntropyDims> check_cross_entropy(const CrossEntropyArgs& a, FloatSet fs,
                                             std::size_t logit_bytes) {
  constexpr std::string_view op = "cross_entropy";
  FERRY_TRY(expect_ndim(a.hidden, op, "hidden", 2));
  FERRY_TRY(expect_ndim(a.weight, op, "weight", 2));
  CrossEntropyDims d{a.hidden.shape[0], a.hidden.shape[1], a.weight.shape[0], 0};
  if (d.C < 1 || d.V < 1) {
    return invalid_argument("kernels: cross_entropy: need C >= 1 and V >= 1, got C={} V={}", d.C,
                            d.V);
  }
  if (a.chunk_tokens < 1) {
    return invalid_argument("kernels: cross_entropy: chunk_tokens = {} < 1", a.chunk_tokens);
  }
  if (!std::isfinite(a.grad_scale)) {
    return invalid_argument("kernels: cross_entropy: grad_scale is not finite");
  }
  d.chunk = cross_entropy_chunk_rows(a);
  FERRY_TRY(expect(a.hidden, op, "hidden", Kind::kFloatIn, fs, {d.T, d.C}));
  FERRY_TRY(expect(a.weight, op, "weight", Kind::kFloatIn, fs, {d.V, d.C}));
  FERRY_TRY(expect(a.targets, op, "targets", Kind::kI32, fs, {d.T}));
  FERRY_TRY(expect(a.nll, op, "nll", Kind::kFloatOut, fs, {d.T}));
  FERRY_TRY(expect_optional(a.d_hidden, op, "d_hidden", Kind::kFloatOut, fs, {d.T, d.C}));
  FERRY_TRY(expect_optional(a.d_weight, op, "d_weight", Kind::kFloatOut, fs, {d.V, d.C}));
  const std::size_t need = static_cast<std::size_t>(d.chunk * d.V) * logit_bytes;
  if (need > 0) {
    FERRY_TRY(expect_ndim(a.workspace, op, "workspace", 1));
    FERRY_TRY(expect(a.workspace, op, "workspace", Kind::kU8, fs, {a.workspace.shape[0]}));
    if (static_cast<std::size_t>(a.workspace.shape[0]) < need) {
      return invalid_argument("kernels: cross_entropy: workspace has {} bytes, needs {}",
                              a.workspace.shape[0], need);
    }
    if (reinterpret_cast<std::uintptr_t>(a.workspace.data) % logit_bytes != 0) {
      return invalid_argument("kernels: cross_entropy: workspace must be {}-byte aligned",
                              logit_bytes);
    }
  }
  const auto* tg = a.targets.as<std::int32_t>();
  for (std::int64_t t = 0; t < d.T; ++t) {
    if (tg[t] != a.ignore_index && (tg[t] < 0 || tg[t] >= d.V)) {
      return invalid_argument("kernels: cross_entropy: targets[{}] = {} outside [0, {})", t, tg[t],
                              d.V);
    }
  }
  return d;
}

}  // namespace ferry::kernels::detail
