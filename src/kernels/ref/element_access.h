// SPDX-License-Identifier: Apache-2.0
// Element access for the reference backend: read any accepted float element as f64, write an f64
// into an output of any accepted float dtype (rounded to nearest even). One switch per element is
// slow and obviously correct, which is what the reference is for. Views are contiguous (checked
// by the op before any access), so element i is data[i].
#pragma once

#include <cstdint>

#include "core/check.h"
#include "core/dtype.h"
#include "tensor/tensor_view.h"

namespace ferry::kernels::ref {

inline double load(const ConstTensorView& v, std::int64_t i) {
  switch (v.dtype) {
    case DType::kF32:
      return v.as<float>()[i];
    case DType::kF64:
      return v.as<double>()[i];
    case DType::kBF16:
      return bf16_to_f32(v.as<std::uint16_t>()[i]);
    case DType::kI32:
      return v.as<std::int32_t>()[i];
    default:
      FERRY_CHECK(false, "reference: load from unchecked dtype {}", to_string(v.dtype));
  }
  return 0.0;
}

inline void store(const TensorView& v, std::int64_t i, double x) {
  switch (v.dtype) {
    case DType::kF32:
      v.as<float>()[i] = static_cast<float>(x);
      return;
    case DType::kF64:
      v.as<double>()[i] = x;
      return;
    case DType::kBF16:
      v.as<std::uint16_t>()[i] = f32_to_bf16(static_cast<float>(x));
      return;
    default:
      FERRY_CHECK(false, "reference: store to unchecked dtype {}", to_string(v.dtype));
  }
}

inline std::int32_t load_i32(const ConstTensorView& v, std::int64_t i) {
  return v.as<std::int32_t>()[i];
}

}  // namespace ferry::kernels::ref
