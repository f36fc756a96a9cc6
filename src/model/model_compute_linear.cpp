// SPDX-License-Identifier: Apache-2.0
// ModelCompute's linear layers in the chosen GemmPrecision (model_compute.h's header comment).
//
// kBf16 is PyTorch autocast's bf16 matmul: each GEMM operand is rounded to bf16 (Backend::convert,
// round to nearest even) into a scratch buffer and the backend multiplies bf16 x bf16 with f32
// accumulation into an f32 output. Everything between GEMMs (residual stream, norms, softmax,
// gradients, weight gradients) stays f32, so only the multiplications lose precision, the same
// place they do in PyTorch. On a backend without bf16 GEMMs (CPU) the rounded operands are widened
// back to f32 and multiplied in f32: the products of two bf16 values are exact in f32, so the CPU
// twin differs from the GPU only in the order of the f32 sums (the tolerance rule of style.md).
//
// A weight that comes as a bf16 view (train/stream's bf16 weight views: the streamed bf16 bytes
// read in place) is passed to a native bf16 GEMM as it is: the same bits the rounding of its f32
// widening would give (bf16 -> f32 -> bf16 is the identity), without the convert.
//
// GEMM input reuse (gemm_input_reuse_default()): gemm_input() rounds an activation once into
// gemm.x16 and the GemmInput it returns feeds every GEMM that reads that activation (q/k/v,
// gate/up, their weight gradients); rms_norm_into_gemm_input() and swiglu_into_gemm_input() have
// the norm and SwiGLU kernels write the forward's q/k/v, gate/up and down operands there
// themselves (RmsNormArgs::out16, SwiGluArgs::out16); reusable_act16() hands the backward of the
// layer just forwarded that copy back. With the reuse off these hand out GemmInputs with an empty
// op, and each GEMM rounds its input itself (the old path). gemm.x16 has exactly these writers, and
// each drops act16_layer_ before writing, so the key (layer, workspace, shape) is valid only while
// the copy is. Same bits either way: tests/unit/model/model_compute_gemm_input_test.cpp,
// tests/gpu/model_gpu_gemm_input_test.cpp.
//
// Bias gradients are column sums (1^T dy); they stay f32 GEMMs on the exact dy, as torch's do.
// The MoE router's GEMMs stay f32 in every precision (Megatron's moe_router_dtype=fp32): they are
// tiny ([T, C] x [C, E]), and top-k is a discrete choice on the logits, so bf16 logits would flip
// near-ties between two backends that differ only in the order of their sums (seen on the GPU:
// one token of the qwen3_moe fixture changed experts).
#include <cstdlib>
#include <string_view>

#include "core/check.h"
#include "model/model_compute.h"
#include "model/model_compute_buffers.h"

namespace ferry::model {

using detail::f32_view;

std::string_view to_string(GemmPrecision p) { return p == GemmPrecision::kBf16 ? "bf16" : "f32"; }

Result<GemmPrecision> parse_gemm_precision(std::string_view s, Device compute) {
  if (s == "f32") return GemmPrecision::kF32;
  if (s == "bf16") return GemmPrecision::kBf16;
  if (s == "auto") return compute == Device::kCpu ? GemmPrecision::kF32 : GemmPrecision::kBf16;
  return invalid_argument("model: GEMM precision '{}' (expected auto, f32 or bf16)", s);
}

bool is_gemm_weight_role(ParamRole r) {
  switch (r) {
    case ParamRole::kQProj:
    case ParamRole::kKProj:
    case ParamRole::kVProj:
    case ParamRole::kOProj:
    case ParamRole::kGate:
    case ParamRole::kUp:
    case ParamRole::kDown:
    case ParamRole::kExpertGate:
    case ParamRole::kExpertUp:
    case ParamRole::kExpertDown:
      return true;
    default:
      return false;
  }
}

void ModelCompute::plan_linear_buffers(const DecoderGeometry& geo, std::int64_t T,
                                       kernels::Backend& backend, Scratch& s,
                                       detail::BufferTable& tab) {
  const std::int64_t C = geo.hidden, HD = std::int64_t(geo.heads) * geo.head_dim,
                     GD = std::int64_t(geo.kv_heads) * geo.head_dim, F = geo.mlp_width,
                     Fe = geo.expert_width, E = geo.experts, K = geo.top_k;
  // The widest operand of each kind: activations and output gradients are [T, in|out] of a
  // dense linear or [T*K, in|out] of an expert's; weights [out, in]. The router ([E, C]) is not
  // among them: its GEMMs keep f32 operands.
  const std::int64_t widest = std::max({C, HD, GD, F});
  const std::int64_t rows = std::max(T * widest, E > 0 ? T * K * std::max(C, Fe) : 0);
  const std::int64_t weight = C * std::max({HD, GD, F, Fe});
  const bool twin = !backend.supports(kernels::OpKind::kGemm, DType::kBF16);
  tab.add(s.x16, "gemm.x16", rows);
  tab.add(s.dy16, "gemm.dy16", rows);
  tab.add(s.w16, "gemm.w16", weight);
  if (twin) {
    tab.add(s.x16_f, "gemm.x16_f", rows);
    tab.add(s.dy16_f, "gemm.dy16_f", rows);
    tab.add(s.w16_f, "gemm.w16_f", weight);
  }
}

void ModelCompute::plan_head_operands(const DecoderGeometry& geo, std::int64_t T,
                                      kernels::Backend& backend, Scratch& s,
                                      detail::BufferTable& tab) {
  const std::int64_t C = geo.hidden, V = geo.vocab;
  tab.add(s.hf16, "gemm.hf16", T * C);
  tab.add(s.head16, "gemm.head16", V * C);
  if (!backend.supports(kernels::OpKind::kGemm, DType::kBF16)) {
    tab.add(s.hf16_f, "gemm.hf16_f", T * C);
    tab.add(s.head16_f, "gemm.head16_f", V * C);
  }
}

Result<ConstTensorView> ModelCompute::gemm_operand(const ConstTensorView& v, const Bf16Buf& b16,
                                                   const F32Buf& f32, bool f32_operands) {
  if (precision_ == GemmPrecision::kF32 || f32_operands) return v;
  if (v.dtype == DType::kBF16 && native_bf16_gemm_) return v;
  FERRY_CHECK(v.ndim == 2 && v.is_contiguous(), "model: GEMM operand {} is not a contiguous 2-d",
              v.shape_string());
  const std::int64_t r = v.shape[0], c = v.shape[1];
  ConstTensorView rounded = v;
  if (v.dtype != DType::kBF16) {
    const TensorView out = detail::typed_view(b16, DType::kBF16, {r, c});
    FERRY_TRY(be_.convert({.out = out, .in = v}, st()));
    rounded = out;
  }
  if (native_bf16_gemm_) return rounded;
  const TensorView wide = f32_view(f32, {r, c});
  FERRY_TRY(be_.convert({.out = wide, .in = rounded}, st()));
  return ConstTensorView(wide);
}

bool gemm_input_reuse_default() {
  const char* e = std::getenv("FERRY_GEMM_INPUT_REUSE");
  return e == nullptr || std::string_view(e) != "0";
}

Result<ModelCompute::GemmInput> ModelCompute::gemm_input(const ConstTensorView& x,
                                                         bool f32_operands) {
  Scratch& s = *scratch_;
  if (precision_ == GemmPrecision::kF32 || f32_operands) return GemmInput{x, x};
  if (x.dtype == DType::kBF16 && native_bf16_gemm_) return GemmInput{x, x};
  // x16 / x16_f get new contents: they no longer hold a layer's SwiGLU output.
  act16_layer_ = -1;
  if (x.dtype != DType::kBF16) ++gemm_input_converts_;
  FERRY_ASSIGN_OR_RETURN(const ConstTensorView op, gemm_operand(x, s.x16, s.x16_f));
  return GemmInput{x, op};
}

Result<ModelCompute::GemmInput> ModelCompute::shared_gemm_input(const ConstTensorView& x) {
  if (!gemm_input_reuse_) return GemmInput{x, {}};
  return gemm_input(x);
}

Status ModelCompute::linear(const TensorView& y, const GemmInput& x, const ConstTensorView& w,
                            const ConstTensorView& bias, bool f32_operands) {
  if (x.op.data == nullptr) return linear(y, x.x, w, bias, f32_operands);  // not rounded yet
  Scratch& s = *scratch_;
  FERRY_ASSIGN_OR_RETURN(const ConstTensorView wa, gemm_operand(w, s.w16, s.w16_f, f32_operands));
  if (wa.data != w.data) ++gemm_weight_converts_;
  return be_.gemm({.out = y, .a = x.op, .b = wa, .bias = bias, .trans_b = true}, st());
}

Status ModelCompute::linear(const TensorView& y, const ConstTensorView& x, const ConstTensorView& w,
                            const ConstTensorView& bias, bool f32_operands) {
  FERRY_ASSIGN_OR_RETURN(const GemmInput xa, gemm_input(x, f32_operands));
  return linear(y, xa, w, bias, f32_operands);
}

Status ModelCompute::linear_backward(const TensorView& dx, const TensorView& dw,
                                     const TensorView& db, const ConstTensorView& dy,
                                     const GemmInput& x, const ConstTensorView& w,
                                     bool accumulate_dx, bool f32_operands) {
  if (x.op.data == nullptr) {  // not rounded yet
    return linear_backward(dx, dw, db, dy, x.x, w, accumulate_dx, f32_operands);
  }
  Scratch& s = *scratch_;
  FERRY_ASSIGN_OR_RETURN(const ConstTensorView dya,
                         gemm_operand(dy, s.dy16, s.dy16_f, f32_operands));
  FERRY_TRY(be_.gemm({.out = dw, .a = dya, .b = x.op, .trans_a = true, .beta = 1.0f}, st()));
  if (!db.empty_view()) {
    const TensorView db_row = TensorView::contiguous(db.data, db.dtype, db.device, {1, db.numel()});
    const ConstTensorView ones_row = f32_view(s.ones, {1, dy.shape[0]});
    FERRY_TRY(be_.gemm({.out = db_row, .a = ones_row, .b = dy, .beta = 1.0f}, st()));
  }
  if (dx.empty_view()) return {};
  FERRY_ASSIGN_OR_RETURN(const ConstTensorView wa, gemm_operand(w, s.w16, s.w16_f, f32_operands));
  if (wa.data != w.data) ++gemm_weight_converts_;
  return be_.gemm({.out = dx, .a = dya, .b = wa, .beta = accumulate_dx ? 1.0f : 0.0f}, st());
}

Status ModelCompute::linear_backward(const TensorView& dx, const TensorView& dw,
                                     const TensorView& db, const ConstTensorView& dy,
                                     const ConstTensorView& x, const ConstTensorView& w,
                                     bool accumulate_dx, bool f32_operands) {
  FERRY_ASSIGN_OR_RETURN(const GemmInput xa, gemm_input(x, f32_operands));
  return linear_backward(dx, dw, db, dy, xa, w, accumulate_dx, f32_operands);
}

Result<ModelCompute::GemmInput> ModelCompute::swiglu_into_gemm_input(const TensorView& out,
                                                                     const ConstTensorView& gate,
                                                                     const ConstTensorView& up) {
  Scratch& s = *scratch_;
  if (!gemm_input_reuse_ || precision_ == GemmPrecision::kF32) {
    FERRY_TRY(be_.swiglu({.out = out, .gate = gate, .up = up}, st()));
    return gemm_input(out);  // the old path: a separate convert (none for f32 GEMMs)
  }
  // The SwiGLU kernel writes the bf16 rounding itself (SwiGluArgs::out16): convert(out)'s bits.
  act16_layer_ = -1;
  const TensorView out16 = detail::typed_view(s.x16, DType::kBF16, {out.shape[0], out.shape[1]});
  FERRY_TRY(be_.swiglu({.out = out, .gate = gate, .up = up, .out16 = out16}, st()));
  FERRY_ASSIGN_OR_RETURN(const ConstTensorView op, gemm_operand(out16, s.x16, s.x16_f));
  return GemmInput{out, op};
}

Result<ModelCompute::GemmInput> ModelCompute::rms_norm_into_gemm_input(
    const kernels::RmsNormArgs& args) {
  FERRY_CHECK(args.out16.data == nullptr, "model: rms_norm_into_gemm_input owns out16");
  const ConstTensorView out = args.out;
  if (!gemm_input_reuse_) {
    FERRY_TRY(be_.rms_norm(args, st()));
    return GemmInput{out, {}};  // the old path: each GEMM rounds out itself
  }
  if (precision_ == GemmPrecision::kF32) {
    FERRY_TRY(be_.rms_norm(args, st()));
    return GemmInput{out, out};  // gemm_input(out) for f32 GEMMs
  }
  // The norm kernel writes the bf16 rounding itself (RmsNormArgs::out16): convert(out)'s bits.
  Scratch& s = *scratch_;
  act16_layer_ = -1;
  kernels::RmsNormArgs with_copy = args;
  with_copy.out16 = detail::typed_view(s.x16, DType::kBF16, {out.shape[0], out.shape[1]});
  FERRY_TRY(be_.rms_norm(with_copy, st()));
  FERRY_ASSIGN_OR_RETURN(const ConstTensorView op,
                         gemm_operand(ConstTensorView(with_copy.out16), s.x16, s.x16_f));
  return GemmInput{out, op};
}

ModelCompute::GemmInput ModelCompute::reusable_act16(int l, const LayerActs& a,
                                                     const ConstTensorView& act) {
  if (!gemm_input_reuse_ || act16_layer_ != l || act16_acts_ != &a ||
      act16_shape_[0] != act.shape[0] || act16_shape_[1] != act.shape[1]) {
    return GemmInput{act, {}};  // the down projection's GEMMs round act themselves
  }
  Scratch& s = *scratch_;
  const std::int64_t r = act.shape[0], c = act.shape[1];
  // What swiglu_into_gemm_input handed the down projection: the bf16 copy, or its widening.
  const ConstTensorView op = native_bf16_gemm_
                                 ? ConstTensorView(detail::typed_view(s.x16, DType::kBF16, {r, c}))
                                 : ConstTensorView(f32_view(s.x16_f, {r, c}));
  return GemmInput{act, op};
}

}  // namespace ferry::model
