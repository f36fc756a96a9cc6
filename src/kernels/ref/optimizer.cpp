// SPDX-License-Identifier: Apache-2.0
// Reference AdamW step and sum of squares (the global-norm clip's input), both in f64.
// AdamW follows ops.h exactly: g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr * (m/(1-b1^step) / (sqrt(v/(1-b2^step)) + eps) + weight_decay * p), where the decay term
// uses p before this step. m, v, p are rounded to their dtype once per step; param_bf16 (optional)
// receives f32_to_bf16 of the stored f32 parameter. Hyper-parameters are rejected with
// invalid_argument when step < 1 or a beta is outside [0, 1). Covered by dense_ref_test.cpp.
#include <cmath>

#include "kernels/ref/arg_checks.h"
#include "kernels/ref/element_access.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {

Status ReferenceBackend::adamw(const AdamWArgs& a, Stream&) {
  constexpr std::string_view kWho = "reference adamw";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "param", a.param, 1, kF32F64));
  const std::int64_t n = a.param.shape[0];
  FERRY_TRY(check_view(kWho, "m", a.m, {n}, kF32F64));
  FERRY_TRY(check_view(kWho, "v", a.v, {n}, kF32F64));
  FERRY_TRY(check_view(kWho, "grad", a.grad, {n}, kF32F64Bf16));
  FERRY_TRY(check_optional_view(kWho, "param_bf16", a.param_bf16, {n}, kBf16Only));
  if (a.step < 1)
    return invalid_argument("kernels: {}: step {} < 1 (steps are 1-based)", kWho, a.step);
  if (!(a.beta1 >= 0.0f && a.beta1 < 1.0f) || !(a.beta2 >= 0.0f && a.beta2 < 1.0f)) {
    return invalid_argument("kernels: {}: betas ({}, {}) must lie in [0, 1)", kWho, a.beta1,
                            a.beta2);
  }
  const double b1 = a.beta1, b2 = a.beta2, lr = a.lr, eps = a.eps, wd = a.weight_decay;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(a.step));
  const bool write_bf16 = !is_absent(a.param_bf16);
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = ref::load(a.grad, i) * static_cast<double>(a.grad_scale);
    const double m = b1 * ref::load(a.m, i) + (1.0 - b1) * g;
    const double v = b2 * ref::load(a.v, i) + (1.0 - b2) * g * g;
    const double p = ref::load(a.param, i);
    const double update = (m / bc1) / (std::sqrt(v / bc2) + eps) + wd * p;
    ref::store(a.m, i, m);
    ref::store(a.v, i, v);
    ref::store(a.param, i, p - lr * update);
    if (write_bf16) ref::store(a.param_bf16, i, ref::load(a.param, i));
  }
  return ok_status();
}

Status ReferenceBackend::sum_squares(const SumSquaresArgs& a, Stream&) {
  constexpr std::string_view kWho = "reference sum_squares";
  using namespace detail;
  FERRY_TRY(check_view(kWho, "out", a.out, {1}, kF32F64));
  if (is_absent(a.x)) return invalid_argument("kernels: {}: required argument x is missing", kWho);
  FERRY_TRY(check_rank(kWho, "x", a.x, a.x.ndim, kF32F64Bf16));
  double s = 0.0;
  for (std::int64_t i = 0; i < a.x.numel(); ++i) {
    const double x = ref::load(a.x, i);
    s += x * x;
  }
  ref::store(a.out, 0, s);
  return ok_status();
}

}  // namespace ferry::kernels
