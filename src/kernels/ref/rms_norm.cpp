// SPDX-License-Identifier: Apache-2.0
// Reference RMSNorm, row by row in f64:
//   forward  r = 1 / sqrt(mean_j x_j^2 + eps),  y_j = x_j * r * w_j   (r saved to rstd)
//   backward with s = sum_k dy_k w_k x_k:
//            dx_j = r * w_j * dy_j - r^3 * x_j * s / C
//            dw_j += sum over rows of dy_j * x_j * r
// The backward uses the saved rstd (as every fast backend will); derivation: dr/dx_j = -r^3 x_j/C.
// Covered by dense_fd_test.cpp (central differences in f64) and dense_ref_test.cpp.
#include <cmath>

#include "core/dtype.h"
#include "kernels/ref/arg_checks.h"
#include "kernels/ref/element_access.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {

Status ReferenceBackend::rms_norm(const RmsNormArgs& a, Stream&) {
  constexpr std::string_view kWho = "reference rms_norm";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "in", a.in, 2, kF32F64));
  const std::int64_t n = a.in.shape[0], c = a.in.shape[1];
  FERRY_TRY(check_view(kWho, "out", a.out, {n, c}, kF32F64));
  FERRY_TRY(check_view(kWho, "weight", a.weight, {c}, kF32F64Bf16));
  FERRY_TRY(check_optional_view(kWho, "rstd", a.rstd, {n}, kF32F64));
  // The optional bf16 copy: out (f32 only) rounded as convert() rounds it.
  FERRY_TRY(check_optional_view(kWho, "out16", a.out16, {n, c}, kBf16Only));
  if (!is_absent(a.out16) && a.out.dtype != DType::kF32)
    return invalid_argument("kernels: {}: out16 needs an f32 out", kWho);
  if (!(a.eps >= 0.0f)) return invalid_argument("kernels: {}: eps {} < 0", kWho, a.eps);
  if (c == 0) return invalid_argument("kernels: {}: rows have 0 columns", kWho);
  for (std::int64_t row = 0; row < n; ++row) {
    double ss = 0.0;
    for (std::int64_t j = 0; j < c; ++j) {
      const double x = ref::load(a.in, row * c + j);
      ss += x * x;
    }
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(c) + static_cast<double>(a.eps));
    for (std::int64_t j = 0; j < c; ++j) {
      ref::store(a.out, row * c + j, ref::load(a.in, row * c + j) * r * ref::load(a.weight, j));
      if (!is_absent(a.out16)) {
        a.out16.as<std::uint16_t>()[row * c + j] = f32_to_bf16(a.out.as<float>()[row * c + j]);
      }
    }
    if (!is_absent(a.rstd)) ref::store(a.rstd, row, r);
  }
  return ok_status();
}

Status ReferenceBackend::rms_norm_backward(const RmsNormBackwardArgs& a, Stream&) {
  constexpr std::string_view kWho = "reference rms_norm_backward";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "in", a.in, 2, kF32F64));
  const std::int64_t n = a.in.shape[0], c = a.in.shape[1];
  FERRY_TRY(check_view(kWho, "d_in", a.d_in, {n, c}, kF32F64));
  FERRY_TRY(check_view(kWho, "d_weight", a.d_weight, {c}, kF32F64));
  FERRY_TRY(check_view(kWho, "d_out", a.d_out, {n, c}, kF32F64));
  FERRY_TRY(check_view(kWho, "weight", a.weight, {c}, kF32F64Bf16));
  FERRY_TRY(check_view(kWho, "rstd", a.rstd, {n}, kF32F64));
  const double inv_c = c > 0 ? 1.0 / static_cast<double>(c) : 0.0;
  for (std::int64_t row = 0; row < n; ++row) {
    const double r = ref::load(a.rstd, row);
    double s = 0.0;
    for (std::int64_t j = 0; j < c; ++j) {
      const std::int64_t i = row * c + j;
      s += ref::load(a.d_out, i) * ref::load(a.weight, j) * ref::load(a.in, i);
    }
    for (std::int64_t j = 0; j < c; ++j) {
      const std::int64_t i = row * c + j;
      const double dx = r * ref::load(a.weight, j) * ref::load(a.d_out, i) -
                        r * r * r * ref::load(a.in, i) * s * inv_c;
      ref::store(a.d_in, i, dx);
    }
  }
  // d_weight column by column so each element is rounded once (f64 sum over rows, then one add).
  for (std::int64_t j = 0; j < c; ++j) {
    double acc = 0.0;
    for (std::int64_t row = 0; row < n; ++row) {
      const std::int64_t i = row * c + j;
      acc += ref::load(a.d_out, i) * ref::load(a.in, i) * ref::load(a.rstd, row);
    }
    ref::store(a.d_weight, j, ref::load(a.d_weight, j) + acc);
  }
  return ok_status();
}

}  // namespace ferry::kernels
