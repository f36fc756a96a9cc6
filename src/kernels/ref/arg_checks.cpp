// SPDX-License-Identifier: Apache-2.0
// Argument validation for the host backends; see arg_checks.h for the error classes.
#include "kernels/ref/arg_checks.h"

#include <string>

namespace ferry::kernels::detail {

std::string DTypeSet::to_string() const {
  std::string s;
  for (unsigned d = 0; d < 32; ++d) {
    if ((bits_ >> d) & 1u) {
      if (!s.empty()) s += "/";
      s += ferry::to_string(static_cast<DType>(d));
    }
  }
  return s;
}

Status check_rank(std::string_view who, std::string_view arg, const ConstTensorView& v, int ndim,
                  DTypeSet dtypes) {
  if (v.ndim != ndim) {
    return invalid_argument("kernels: {}: {} has rank {} {}, need rank {}", who, arg, v.ndim,
                            v.shape_string(), ndim);
  }
  for (int i = 0; i < v.ndim; ++i) {
    if (v.shape[i] < 0) {
      return invalid_argument("kernels: {}: {} has a negative dim {}", who, arg, v.shape_string());
    }
  }
  if (v.data == nullptr && v.numel() != 0) {
    return invalid_argument("kernels: {}: {} {} has no data", who, arg, v.shape_string());
  }
  if (v.device != Device::kCpu) {
    return unimplemented("kernels: {}: {} is on {}, this backend reads host memory", who, arg,
                         ferry::to_string(v.device));
  }
  if (!dtypes.contains(v.dtype)) {
    return unimplemented("kernels: {}: {} is {}, supported {}", who, arg, ferry::to_string(v.dtype),
                         dtypes.to_string());
  }
  if (!v.is_contiguous()) {
    return unimplemented("kernels: {}: {} {} is not contiguous", who, arg, v.shape_string());
  }
  return ok_status();
}

Status check_view(std::string_view who, std::string_view arg, const ConstTensorView& v,
                  std::initializer_list<std::int64_t> shape, DTypeSet dtypes) {
  if (v.data == nullptr && v.ndim == 0) {
    return invalid_argument("kernels: {}: required argument {} is missing", who, arg);
  }
  FERRY_TRY(check_rank(who, arg, v, static_cast<int>(shape.size()), dtypes));
  int i = 0;
  for (std::int64_t d : shape) {
    if (v.shape[i] != d) {
      std::string want = "[";
      int j = 0;
      for (std::int64_t e : shape) want += (j++ ? ", " : "") + std::to_string(e);
      return invalid_argument("kernels: {}: {} has shape {}, need {}]", who, arg, v.shape_string(),
                              want);
    }
    ++i;
  }
  return ok_status();
}

Status check_optional_view(std::string_view who, std::string_view arg, const ConstTensorView& v,
                           std::initializer_list<std::int64_t> shape, DTypeSet dtypes) {
  if (is_absent(v)) return ok_status();
  return check_view(who, arg, v, shape, dtypes);
}

}  // namespace ferry::kernels::detail
