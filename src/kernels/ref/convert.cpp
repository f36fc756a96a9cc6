// SPDX-License-Identifier: Apache-2.0
// Reference dtype conversion: out[i] = in[i] through f64 (load), rounded to the output dtype by
// element_access.h's store (f32 -> bf16: round to nearest even). Any pair of f32 / f64 / bf16;
// equal dtypes copy. Covered by dense_ref_test.cpp.
#include "kernels/ref/arg_checks.h"
#include "kernels/ref/element_access.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {

Status ReferenceBackend::convert(const ConvertArgs& a, Stream&) {
  constexpr std::string_view kWho = "reference convert";
  using namespace detail;
  if (is_absent(a.out) || is_absent(a.in))
    return invalid_argument("kernels: {}: out and in are required", kWho);
  FERRY_TRY(check_rank(kWho, "out", a.out, a.out.ndim, kF32F64Bf16));
  FERRY_TRY(check_rank(kWho, "in", a.in, a.in.ndim, kF32F64Bf16));
  if (a.in.numel() != a.out.numel()) {
    return invalid_argument("kernels: {}: in {} and out {} differ in element count", kWho,
                            a.in.shape_string(), a.out.shape_string());
  }
  for (std::int64_t i = 0; i < a.out.numel(); ++i) ref::store(a.out, i, ref::load(a.in, i));
  return ok_status();
}

}  // namespace ferry::kernels
