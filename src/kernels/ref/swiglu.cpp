// SPDX-License-Identifier: Apache-2.0
// Reference SwiGLU in f64: out = silu(g) * u with silu(g) = g * sigmoid(g). Backward (overwrites):
//   d_up   = d_out * silu(g)
//   d_gate = d_out * u * sigmoid(g) * (1 + g * (1 - sigmoid(g)))   [d silu/dg, product rule]
// sigmoid(g) = 1 / (1 + exp(-g)) stays finite for every finite g (exp overflow gives 0).
// Covered by dense_fd_test.cpp and dense_ref_test.cpp.
#include <cmath>

#include "core/dtype.h"
#include "kernels/ref/arg_checks.h"
#include "kernels/ref/element_access.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {
namespace {

double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

}  // namespace

Status ReferenceBackend::swiglu(const SwiGluArgs& a, Stream&) {
  constexpr std::string_view kWho = "reference swiglu";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "gate", a.gate, 2, kF32F64));
  const std::int64_t n = a.gate.shape[0], f = a.gate.shape[1];
  FERRY_TRY(check_view(kWho, "up", a.up, {n, f}, kF32F64));
  FERRY_TRY(check_view(kWho, "out", a.out, {n, f}, kF32F64));
  // The optional bf16 copy: out (f32 only) rounded as convert() rounds it.
  FERRY_TRY(check_optional_view(kWho, "out16", a.out16, {n, f}, kBf16Only));
  if (!is_absent(a.out16) && a.out.dtype != DType::kF32)
    return invalid_argument("kernels: {}: out16 needs an f32 out", kWho);
  for (std::int64_t i = 0; i < n * f; ++i) {
    const double g = ref::load(a.gate, i);
    ref::store(a.out, i, g * sigmoid(g) * ref::load(a.up, i));
    if (!is_absent(a.out16)) a.out16.as<std::uint16_t>()[i] = f32_to_bf16(a.out.as<float>()[i]);
  }
  return ok_status();
}

Status ReferenceBackend::swiglu_backward(const SwiGluBackwardArgs& a, Stream&) {
  constexpr std::string_view kWho = "reference swiglu_backward";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "gate", a.gate, 2, kF32F64));
  const std::int64_t n = a.gate.shape[0], f = a.gate.shape[1];
  FERRY_TRY(check_view(kWho, "up", a.up, {n, f}, kF32F64));
  FERRY_TRY(check_view(kWho, "d_out", a.d_out, {n, f}, kF32F64));
  FERRY_TRY(check_view(kWho, "d_gate", a.d_gate, {n, f}, kF32F64));
  FERRY_TRY(check_view(kWho, "d_up", a.d_up, {n, f}, kF32F64));
  for (std::int64_t i = 0; i < n * f; ++i) {
    const double g = ref::load(a.gate, i), u = ref::load(a.up, i), dy = ref::load(a.d_out, i);
    const double sg = sigmoid(g);
    ref::store(a.d_up, i, dy * g * sg);
    ref::store(a.d_gate, i, dy * u * sg * (1.0 + g * (1.0 - sg)));
  }
  return ok_status();
}

}  // namespace ferry::kernels
