// SPDX-License-Identifier: Apache-2.0
// Reference GEMM: out = alpha * op(a) @ op(b) + beta * out + bias, one f64 dot product per output
// element. Conventions (shared by every backend, see docs/kernels.md):
//   - beta == 0 means out is not read (BLAS convention: garbage or NaN in out is ignored);
//   - bias is added once, unscaled by alpha or beta;
//   - out must not alias a, b or bias.
// a and b may be f32, f64 or bf16; out and bias f32 or f64. Covered by dense_ref_test.cpp
// (hand-computed cases) and dense_fd_test.cpp.
#include "kernels/ref/arg_checks.h"
#include "kernels/ref/element_access.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {

Status ReferenceBackend::gemm(const GemmArgs& a, Stream&) {
  constexpr std::string_view kWho = "reference gemm";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "out", a.out, 2, kF32F64));
  FERRY_TRY(check_rank(kWho, "a", a.a, 2, kF32F64Bf16));
  const std::int64_t m = a.out.shape[0], n = a.out.shape[1];
  const std::int64_t k = a.trans_a ? a.a.shape[0] : a.a.shape[1];
  if (a.trans_a) {
    FERRY_TRY(check_view(kWho, "a (trans_a)", a.a, {k, m}, kF32F64Bf16));
  } else {
    FERRY_TRY(check_view(kWho, "a", a.a, {m, k}, kF32F64Bf16));
  }
  if (a.trans_b) {
    FERRY_TRY(check_view(kWho, "b (trans_b)", a.b, {n, k}, kF32F64Bf16));
  } else {
    FERRY_TRY(check_view(kWho, "b", a.b, {k, n}, kF32F64Bf16));
  }
  FERRY_TRY(check_optional_view(kWho, "bias", a.bias, {n}, kF32F64));
  const bool has_bias = !is_absent(a.bias);

  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double av = ref::load(a.a, a.trans_a ? p * m + i : i * k + p);
        const double bv = ref::load(a.b, a.trans_b ? j * k + p : p * n + j);
        acc += av * bv;
      }
      double r = static_cast<double>(a.alpha) * acc;
      if (a.beta != 0.0f) r += static_cast<double>(a.beta) * ref::load(a.out, i * n + j);
      if (has_bias) r += ref::load(a.bias, j);
      ref::store(a.out, i * n + j, r);
    }
  }
  return ok_status();
}

}  // namespace ferry::kernels
