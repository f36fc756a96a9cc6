// SPDX-License-Identifier: Apache-2.0
// Reference elementwise add: out = a + b over same-shaped contiguous views (any rank <= 4).
// out may alias a or b exactly (element i is read before it is written). Covered by
// dense_ref_test.cpp.
#include <utility>

#include "kernels/ref/arg_checks.h"
#include "kernels/ref/element_access.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {

Status ReferenceBackend::add(const AddArgs& a, Stream&) {
  constexpr std::string_view kWho = "reference add";
  using namespace detail;
  if (is_absent(a.out))
    return invalid_argument("kernels: {}: required argument out is missing", kWho);
  FERRY_TRY(check_rank(kWho, "out", a.out, a.out.ndim, kF32F64));
  for (const auto& [name, v] :
       {std::pair<std::string_view, const ConstTensorView*>{"a", &a.a}, {"b", &a.b}}) {
    bool same = !is_absent(*v) && v->ndim == a.out.ndim;
    for (int d = 0; same && d < a.out.ndim; ++d) same = v->shape[d] == a.out.shape[d];
    if (!same) {
      return invalid_argument("kernels: {}: {} has shape {}, out has {}", kWho, name,
                              v->shape_string(), a.out.shape_string());
    }
    FERRY_TRY(check_rank(kWho, name, *v, a.out.ndim, kF32F64));
  }
  for (std::int64_t i = 0; i < a.out.numel(); ++i) {
    ref::store(a.out, i, ref::load(a.a, i) + ref::load(a.b, i));
  }
  return ok_status();
}

}  // namespace ferry::kernels
