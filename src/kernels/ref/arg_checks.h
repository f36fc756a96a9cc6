// SPDX-License-Identifier: Apache-2.0
// Argument validation shared by the host backends (reference and CPU): each op checks every view
// once, up front, and turns a bad argument into a Status that names the op, the argument, what it
// got and what it needed. Nothing here aborts.
//
// Decision (recorded in docs/kernels.md): a shape mismatch between views returns
// invalid_argument rather than aborting. backend.h calls a mismatch between our own modules a bug,
// but the same check also guards user-reachable paths (configs, checkpoints), and a Status costs
// nothing here; callers that consider it a bug wrap the call in FERRY_CHECK_OK.
//   unsupported dtype, non-contiguous view, wrong device -> unimplemented
//   missing required view, wrong rank or shape          -> invalid_argument
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"
#include "tensor/tensor_view.h"

namespace ferry::kernels::detail {

// A set of accepted dtypes, as a bit mask over DType values.
class DTypeSet {
 public:
  constexpr DTypeSet(std::initializer_list<DType> dts) {
    for (DType d : dts) bits_ |= 1u << static_cast<unsigned>(d);
  }
  constexpr bool contains(DType d) const { return (bits_ >> static_cast<unsigned>(d)) & 1u; }
  std::string to_string() const;

 private:
  std::uint32_t bits_ = 0;
};

inline constexpr DTypeSet kF32Only{DType::kF32};
inline constexpr DTypeSet kF32F64{DType::kF32, DType::kF64};
inline constexpr DTypeSet kF32F64Bf16{DType::kF32, DType::kF64, DType::kBF16};
inline constexpr DTypeSet kI32Only{DType::kI32};
inline constexpr DTypeSet kBf16Only{DType::kBF16};

// Checks a required view: present (data != nullptr unless it has no elements), on the host,
// contiguous, of an accepted dtype, and of exactly `shape` (rank included).
// `who` is "<backend> <op>", e.g. "reference rms_norm"; `arg` the field name.
Status check_view(std::string_view who, std::string_view arg, const ConstTensorView& v,
                  std::initializer_list<std::int64_t> shape, DTypeSet dtypes);

// Same, but an absent view (data == nullptr and ndim == 0) is accepted.
Status check_optional_view(std::string_view who, std::string_view arg, const ConstTensorView& v,
                           std::initializer_list<std::int64_t> shape, DTypeSet dtypes);

// Checks only presence, device, contiguity, dtype and rank; the caller reads dims from the view.
Status check_rank(std::string_view who, std::string_view arg, const ConstTensorView& v, int ndim,
                  DTypeSet dtypes);

inline bool is_absent(const ConstTensorView& v) { return v.data == nullptr && v.ndim == 0; }

}  // namespace ferry::kernels::detail
