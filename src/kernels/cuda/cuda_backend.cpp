// SPDX-License-Identifier: Apache-2.0
// CudaBackend: registry (cuda_backend(index)), validation helpers, supports(), GEMM and the dense
// ops. Attention, MoE and cross-entropy are in cuda_backend_moe.cpp.
#include "kernels/cuda/cuda_backend.h"

#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cpu/hybrid_adamw_checks.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/hybrid_adamw_cuda.h"

namespace ferry::kernels {

Result<Backend*> cuda_backend(int device_index) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<cuda::CudaBackend>> backends;
  std::lock_guard<std::mutex> lock(mu);
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess)
    return unavailable("kernels: no CUDA device ({})", cudaGetErrorString(e));
  if (device_index < 0 || device_index >= count)
    return unavailable("kernels: CUDA device {} requested, {} present", device_index, count);
  if (backends.size() < static_cast<std::size_t>(count)) backends.resize(count);
  auto& slot = backends[static_cast<std::size_t>(device_index)];
  if (!slot) {
    auto be = std::make_unique<cuda::CudaBackend>(device_index);
    FERRY_TRY(be->init());
    slot = std::move(be);
  }
  return static_cast<Backend*>(slot.get());
}

}  // namespace ferry::kernels

namespace ferry::kernels::cuda {
namespace {

// FERRY_SMALL_M_GEMM=0 sends every GEMM through cuBLASLt (the A/B of gemm_small_m.cu).
bool small_m_gemm_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FERRY_SMALL_M_GEMM");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

Status check_present(std::string_view op, std::string_view field, const ConstTensorView& v,
                     std::initializer_list<std::int64_t> shape,
                     std::initializer_list<DType> dtypes) {
  if (v.device != Device::kCuda)
    return invalid_argument("cuda {}: {} is on {}, expected cuda", op, field, to_string(v.device));
  bool dt_ok = false;
  for (DType d : dtypes) dt_ok |= d == v.dtype;
  if (!dt_ok) return unimplemented("cuda {}: {} has dtype {}", op, field, to_string(v.dtype));
  bool shape_ok = v.ndim == static_cast<int>(shape.size());
  int i = 0;
  for (std::int64_t s : shape) {
    if (shape_ok && s >= 0 && v.shape[i] != s) shape_ok = false;
    ++i;
  }
  if (!shape_ok) {
    std::string want = "[";
    i = 0;
    for (std::int64_t s : shape) want += (i++ ? ", " : "") + (s < 0 ? "?" : std::to_string(s));
    return invalid_argument("cuda {}: {} has shape {}, expected {}]", op, field, v.shape_string(),
                            want);
  }
  if (!v.is_contiguous()) return unimplemented("cuda {}: {} is not contiguous", op, field);
  return ok_status();
}

}  // namespace

Status need(std::string_view op, std::string_view field, const ConstTensorView& v,
            std::initializer_list<std::int64_t> shape, std::initializer_list<DType> dtypes) {
  if (v.data == nullptr) return invalid_argument("cuda {}: {} is required", op, field);
  return check_present(op, field, v, shape, dtypes);
}

Status maybe(std::string_view op, std::string_view field, const ConstTensorView& v,
             std::initializer_list<std::int64_t> shape, std::initializer_list<DType> dtypes) {
  if (v.data == nullptr) return ok_status();
  return check_present(op, field, v, shape, dtypes);
}

Status same_dtype(std::string_view op, std::string_view fa, const ConstTensorView& a,
                  std::string_view fb, const ConstTensorView& b) {
  if (a.dtype != b.dtype)
    return unimplemented("cuda {}: {} is {} but {} is {} (mixed dtypes)", op, fb,
                         to_string(b.dtype), fa, to_string(a.dtype));
  return ok_status();
}

Status CudaBackend::check_stream(const char* op, const Stream& s) const {
  if (s.device() != Device::kCuda)
    return invalid_argument("cuda {}: stream is a host stream, expected a CUDA stream", op);
  if (s.device_index() != device_)
    return invalid_argument("cuda {}: stream is on device {}, backend on {}", op, s.device_index(),
                            device_);
  return ok_status();
}

bool CudaBackend::supports(OpKind op, DType dt) const {
  switch (op) {
    case OpKind::kAttention:
    case OpKind::kAttentionBackward:
      return dt == DType::kBF16;
    case OpKind::kAdamW:
      return dt == DType::kF32;
    default:
      return dt == DType::kF32 || dt == DType::kBF16;
  }
}

Status CudaBackend::gemm(const GemmArgs& a, Stream& stream) {
  constexpr const char* op = "gemm";
  FERRY_TRY(check_stream(op, stream));
  for (const auto* v : {&a.a, &a.b}) {
    if (v->data == nullptr || v->ndim != 2) return invalid_argument("cuda gemm: a/b must be 2-d");
  }
  if (a.out.data == nullptr || a.out.ndim != 2)
    return invalid_argument("cuda gemm: out must be 2-d");
  const std::int64_t m = a.out.shape[0], n = a.out.shape[1];
  const std::int64_t k = a.trans_a ? a.a.shape[0] : a.a.shape[1];
  const std::int64_t am = a.trans_a ? a.a.shape[1] : a.a.shape[0];
  const std::int64_t bk = a.trans_b ? a.b.shape[1] : a.b.shape[0];
  const std::int64_t bn = a.trans_b ? a.b.shape[0] : a.b.shape[1];
  if (am != m || bk != k || bn != n)
    return invalid_argument("cuda gemm: out {} a {} (trans {}) b {} (trans {}) disagree",
                            a.out.shape_string(), a.a.shape_string(), a.trans_a, a.b.shape_string(),
                            a.trans_b);
  FERRY_TRY(same_dtype(op, "a", a.a, "b", a.b));
  if (a.a.dtype != DType::kBF16 && a.a.dtype != DType::kF32)
    return unimplemented("cuda gemm: inputs of dtype {}", to_string(a.a.dtype));
  if (a.out.dtype != DType::kF32 && a.out.dtype != DType::kBF16)
    return unimplemented("cuda gemm: out of dtype {}", to_string(a.out.dtype));
  if (a.a.dtype == DType::kF32 && a.out.dtype != DType::kF32)
    return unimplemented("cuda gemm: f32 inputs need an f32 out");
  for (const ConstTensorView* v : {&a.a, &a.b, static_cast<const ConstTensorView*>(nullptr)}) {
    const ConstTensorView& x = v ? *v : ConstTensorView(a.out);
    if (x.device != Device::kCuda) return invalid_argument("cuda gemm: a view is not on cuda");
    if (x.stride[1] != 1 || x.stride[0] < x.shape[1])
      return unimplemented("cuda gemm: rows must be contiguous (stride {} {})", x.stride[0],
                           x.stride[1]);
  }
  FERRY_TRY(maybe(op, "bias", a.bias, {n}, {a.out.dtype}));
  if (k == 0) return unimplemented("cuda gemm: k = 0");
  GemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.trans_a = a.trans_a;
  p.trans_b = a.trans_b;
  p.ab_type = a.a.dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  p.out_type = a.out.dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  p.lda = a.a.stride[0];
  p.ldb = a.b.stride[0];
  p.ldo = a.out.stride[0];
  p.has_bias = a.bias.data != nullptr;
  FERRY_CUDA_TRY(cudaSetDevice(device_));
  // A few rows of f32 against a linear layer's weight (serve decode steps): one pass over the
  // weight at HBM speed instead of cuBLASLt's tile kernels (gemm_small_m.cu says why).
  if (small_m_gemm_enabled() && m <= kSmallGemmMaxRows && !a.trans_a && a.trans_b &&
      p.ab_type == CUDA_R_32F && p.out_type == CUDA_R_32F) {
    FERRY_LAUNCH_TRY(op, native(stream),
                     launch_small_m_gemm_f32(static_cast<float*>(a.out.data),
                                             static_cast<const float*>(a.a.data),
                                             static_cast<const float*>(a.b.data),
                                             static_cast<const float*>(a.bias.data), m, n, k, p.lda,
                                             p.ldb, p.ldo, a.alpha, a.beta, native(stream)));
    return ok_status();
  }
  return gemm_.run(p, a.a.data, a.b.data, a.out.data, a.bias.data, a.alpha, a.beta, native(stream));
}

Status CudaBackend::embedding(const EmbeddingArgs& a, Stream& stream) {
  constexpr const char* op = "embedding";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "table", a.table, {-1, -1}, kFloat));
  const std::int64_t v = a.table.shape[0], c = a.table.shape[1];
  FERRY_TRY(need(op, "ids", a.ids, {-1}, kI32));
  const std::int64_t t = a.ids.shape[0];
  FERRY_TRY(need(op, "out", a.out, {t, c}, {a.table.dtype}));
  FERRY_LAUNCH_TRY(op, native(stream),
                   launch_embedding(elt(a.table.dtype), a.out.data, a.table.data,
                                    a.ids.as<std::int32_t>(), t, c, v, native(stream)));
  return ok_status();
}

Status CudaBackend::embedding_backward(const EmbeddingBackwardArgs& a, Stream& stream) {
  constexpr const char* op = "embedding_backward";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "d_table", a.d_table, {-1, -1}, kFloat));
  const std::int64_t v = a.d_table.shape[0], c = a.d_table.shape[1];
  FERRY_TRY(need(op, "ids", a.ids, {-1}, kI32));
  const std::int64_t t = a.ids.shape[0];
  FERRY_TRY(need(op, "d_out", a.d_out, {t, c}, kFloat));
  FERRY_LAUNCH_TRY(
      op, native(stream),
      launch_embedding_backward(elt(a.d_table.dtype), a.d_table.data, elt(a.d_out.dtype),
                                a.d_out.data, a.ids.as<std::int32_t>(), t, c, v, native(stream)));
  return ok_status();
}

Status CudaBackend::rms_norm(const RmsNormArgs& a, Stream& stream) {
  constexpr const char* op = "rms_norm";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "in", a.in, {-1, -1}, kFloat));
  const std::int64_t n = a.in.shape[0], c = a.in.shape[1];
  FERRY_TRY(need(op, "weight", a.weight, {c}, {a.in.dtype}));
  FERRY_TRY(need(op, "out", a.out, {n, c}, {a.in.dtype}));
  FERRY_TRY(maybe(op, "rstd", a.rstd, {n}, kF32));
  if (a.out16.data != nullptr) {
    // The bf16 copy of an f32 output (RmsNormArgs::out16).
    FERRY_TRY(need(op, "in", a.in, {n, c}, {DType::kF32}));
    FERRY_TRY(need(op, "out16", a.out16, {n, c}, {DType::kBF16}));
    FERRY_LAUNCH_TRY(op, native(stream),
                     launch_rms_norm_f32_bf16(a.out.as<float>(), a.out16.data, a.rstd.as<float>(),
                                              a.in.as<float>(), a.weight.as<float>(), n, c, a.eps,
                                              native(stream)));
    return ok_status();
  }
  FERRY_LAUNCH_TRY(op, native(stream),
                   launch_rms_norm(elt(a.in.dtype), a.out.data, a.rstd.as<float>(), a.in.data,
                                   a.weight.data, n, c, a.eps, native(stream)));
  return ok_status();
}

Status CudaBackend::rms_norm_backward(const RmsNormBackwardArgs& a, Stream& stream) {
  constexpr const char* op = "rms_norm_backward";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "in", a.in, {-1, -1}, kFloat));
  const std::int64_t n = a.in.shape[0], c = a.in.shape[1];
  const DType dt = a.in.dtype;
  FERRY_TRY(need(op, "weight", a.weight, {c}, {dt}));
  FERRY_TRY(need(op, "d_out", a.d_out, {n, c}, {dt}));
  FERRY_TRY(need(op, "d_in", a.d_in, {n, c}, {dt}));
  FERRY_TRY(maybe(op, "d_weight", a.d_weight, {c}, {dt}));
  FERRY_TRY(need(op, "rstd", a.rstd, {n}, kF32));
  FERRY_LAUNCH_TRY(
      op, native(stream),
      launch_rms_norm_backward(elt(dt), a.d_in.data, a.d_weight.data, a.d_out.data, a.in.data,
                               a.weight.data, a.rstd.as<float>(), n, c, native(stream)));
  return ok_status();
}

Status CudaBackend::rope(const RopeArgs& a, Stream& stream) {
  constexpr const char* op = "rope";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "x", a.x, {-1, -1, -1}, kFloat));
  const std::int64_t t = a.x.shape[0], h = a.x.shape[1], d = a.x.shape[2];
  FERRY_TRY(need(op, "positions", a.positions, {t}, kI32));
  FERRY_TRY(need(op, "inv_freq", a.inv_freq, {-1}, kF32));
  const std::int64_t r = 2 * a.inv_freq.shape[0];
  if (r > d) return invalid_argument("cuda rope: rotary dims {} > head dim {}", r, d);
  FERRY_LAUNCH_TRY(
      op, native(stream),
      launch_rope(elt(a.x.dtype), a.x.data, a.positions.as<std::int32_t>(), a.inv_freq.as<float>(),
                  t, h, d, r, a.attention_scaling, a.backward, native(stream)));
  return ok_status();
}

Status CudaBackend::swiglu(const SwiGluArgs& a, Stream& stream) {
  constexpr const char* op = "swiglu";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "gate", a.gate, {-1, -1}, kFloat));
  const std::int64_t n = a.gate.shape[0], f = a.gate.shape[1];
  FERRY_TRY(need(op, "up", a.up, {n, f}, {a.gate.dtype}));
  FERRY_TRY(need(op, "out", a.out, {n, f}, {a.gate.dtype}));
  if (a.out16.data != nullptr) {
    // The bf16 copy of an f32 output (SwiGluArgs::out16).
    FERRY_TRY(need(op, "gate", a.gate, {n, f}, {DType::kF32}));
    FERRY_TRY(need(op, "out16", a.out16, {n, f}, {DType::kBF16}));
    FERRY_LAUNCH_TRY(op, native(stream),
                     launch_swiglu_f32_bf16(a.out.as<float>(), a.out16.data, a.gate.as<float>(),
                                            a.up.as<float>(), n * f, native(stream)));
    return ok_status();
  }
  FERRY_LAUNCH_TRY(
      op, native(stream),
      launch_swiglu(elt(a.gate.dtype), a.out.data, a.gate.data, a.up.data, n * f, native(stream)));
  return ok_status();
}

Status CudaBackend::swiglu_backward(const SwiGluBackwardArgs& a, Stream& stream) {
  constexpr const char* op = "swiglu_backward";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "gate", a.gate, {-1, -1}, kFloat));
  const std::int64_t n = a.gate.shape[0], f = a.gate.shape[1];
  const DType dt = a.gate.dtype;
  FERRY_TRY(need(op, "up", a.up, {n, f}, {dt}));
  FERRY_TRY(need(op, "d_out", a.d_out, {n, f}, {dt}));
  FERRY_TRY(need(op, "d_gate", a.d_gate, {n, f}, {dt}));
  FERRY_TRY(need(op, "d_up", a.d_up, {n, f}, {dt}));
  FERRY_LAUNCH_TRY(op, native(stream),
                   launch_swiglu_backward(elt(dt), a.d_gate.data, a.d_up.data, a.d_out.data,
                                          a.gate.data, a.up.data, n * f, native(stream)));
  return ok_status();
}

Status CudaBackend::add(const AddArgs& a, Stream& stream) {
  constexpr const char* op = "add";
  FERRY_TRY(check_stream(op, stream));
  if (a.a.data == nullptr || a.b.data == nullptr || a.out.data == nullptr)
    return invalid_argument("cuda add: out, a and b are required");
  if (a.a.numel() != a.b.numel() || a.a.numel() != a.out.numel() || a.a.ndim != a.out.ndim)
    return invalid_argument("cuda add: shapes {} {} {} disagree", a.out.shape_string(),
                            a.a.shape_string(), a.b.shape_string());
  for (const ConstTensorView* v : {&a.a, &a.b}) {
    if (v->device != Device::kCuda || !v->is_contiguous() || v->dtype != a.out.dtype)
      return unimplemented("cuda add: views must be contiguous cuda tensors of one dtype");
  }
  if (a.out.device != Device::kCuda || !a.out.is_contiguous() ||
      (a.out.dtype != DType::kF32 && a.out.dtype != DType::kBF16))
    return unimplemented("cuda add: out must be a contiguous cuda f32/bf16 tensor");
  FERRY_LAUNCH_TRY(
      op, native(stream),
      launch_add(elt(a.out.dtype), a.out.data, a.a.data, a.b.data, a.out.numel(), native(stream)));
  return ok_status();
}

Status CudaBackend::adamw(const AdamWArgs& a, Stream& stream) {
  constexpr const char* op = "adamw";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "param", a.param, {-1}, kF32));
  const std::int64_t n = a.param.shape[0];
  FERRY_TRY(need(op, "m", a.m, {n}, kF32));
  FERRY_TRY(need(op, "v", a.v, {n}, kF32));
  FERRY_TRY(need(op, "grad", a.grad, {n}, kF32));
  FERRY_TRY(maybe(op, "param_bf16", a.param_bf16, {n}, {DType::kBF16}));
  if (a.step < 1) return invalid_argument("cuda adamw: step {} < 1", a.step);
  AdamWParams p{};
  p.lr = a.lr;
  p.beta1 = a.beta1;
  p.beta2 = a.beta2;
  p.eps = a.eps;
  p.weight_decay = a.weight_decay;
  p.grad_scale = a.grad_scale;
  p.bc1 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step)));
  p.bc2 =
      static_cast<float>(1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step)));
  FERRY_LAUNCH_TRY(op, native(stream),
                   launch_adamw(a.param.as<float>(), a.m.as<float>(), a.v.as<float>(),
                                a.param_bf16.data, a.grad.as<float>(), n, p, native(stream)));
  return ok_status();
}

Status CudaBackend::sum_squares(const SumSquaresArgs& a, Stream& stream) {
  constexpr const char* op = "sum_squares";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(need(op, "out", a.out, {1}, kF32));
  if (a.x.data == nullptr) return invalid_argument("cuda sum_squares: x is required");
  if (a.x.device != Device::kCuda || !a.x.is_contiguous() ||
      (a.x.dtype != DType::kF32 && a.x.dtype != DType::kBF16))
    return unimplemented("cuda sum_squares: x must be a contiguous cuda f32/bf16 tensor");
  float* partials = nullptr;
  if (a.workspace.data != nullptr) {
    if (a.workspace.device != Device::kCuda || a.workspace.bytes() < workspace_bytes(a))
      return invalid_argument("cuda sum_squares: workspace of {} bytes on {}, need {} on cuda",
                              a.workspace.bytes(), to_string(a.workspace.device),
                              workspace_bytes(a));
    partials = static_cast<float*>(a.workspace.data);
  }
  FERRY_LAUNCH_TRY(op, native(stream),
                   launch_sum_squares(elt(a.x.dtype), a.out.as<float>(), a.x.data, a.x.numel(),
                                      partials, native(stream)));
  return ok_status();
}

Status CudaBackend::hybrid_adamw(const HybridAdamWArgs& a, Stream& stream) {
  constexpr const char* op = "hybrid_adamw";
  FERRY_TRY(check_stream(op, stream));
  FERRY_TRY(::ferry::kernels::detail::check_hybrid_adamw("cuda hybrid_adamw", a, Device::kCuda));
  if (a.master == cpu::MasterKind::kF32 && a.states == cpu::StateKind::kF32) {
    return unimplemented(
        "cuda hybrid_adamw: f32 master + f32 states has no device kernel (the CPU's adamw_span)");
  }
  if (a.span.n == 0) return ok_status();
  FERRY_LAUNCH_TRY(op, native(stream),
                   cuda::launch_hybrid_adamw(a.master, a.states, a.k, a.span, native(stream)));
  return ok_status();
}

std::size_t CudaBackend::workspace_bytes(const SumSquaresArgs&) const {
  return kSumSquaresBlocks * sizeof(float);
}

Status CudaBackend::convert(const ConvertArgs& a, Stream& stream) {
  constexpr const char* op = "convert";
  FERRY_TRY(check_stream(op, stream));
  if (a.in.data == nullptr || a.out.data == nullptr)
    return invalid_argument("cuda convert: out and in are required");
  if (a.in.numel() != a.out.numel())
    return invalid_argument("cuda convert: in {} and out {} differ in element count",
                            a.in.shape_string(), a.out.shape_string());
  for (const ConstTensorView* v : {&a.in, static_cast<const ConstTensorView*>(nullptr)}) {
    const ConstTensorView& x = v ? *v : ConstTensorView(a.out);
    if (x.device != Device::kCuda) return invalid_argument("cuda convert: a view is not on cuda");
    if (!x.is_contiguous()) return unimplemented("cuda convert: views must be contiguous");
    if (x.dtype != DType::kF32 && x.dtype != DType::kBF16)
      return unimplemented("cuda convert: dtype {}", to_string(x.dtype));
  }
  FERRY_LAUNCH_TRY(op, native(stream),
                   launch_convert(elt(a.out.dtype), a.out.data, elt(a.in.dtype), a.in.data,
                                  a.out.numel(), native(stream)));
  return ok_status();
}

}  // namespace ferry::kernels::cuda
