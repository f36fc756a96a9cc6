// SPDX-License-Identifier: Apache-2.0
// Non-owning tensor views: data pointer, dtype, device, up to 4 dims, strides in elements.
// Views never own; Buffers and Arenas (mem/) do. A view must not outlive its owner.
//
//   TensorView x = TensorView::contiguous(ptr, DType::kF32, Device::kCpu, {T, C});   // [T, C]
//   float* p = x.as<float>();
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/check.h"
#include "core/device.h"
#include "core/dtype.h"

namespace ferry {

inline constexpr int kMaxDims = 4;

template <typename Ptr>
struct BasicTensorView {
  Ptr data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> shape{};   // only [0, ndim) meaningful
  std::array<std::int64_t, kMaxDims> stride{};  // in elements

  static BasicTensorView contiguous(Ptr data, DType dt, Device dev,
                                    std::initializer_list<std::int64_t> dims) {
    BasicTensorView v;
    v.data = data;
    v.dtype = dt;
    v.device = dev;
    FERRY_CHECK(dims.size() <= kMaxDims, "tensor: {} dims > {}", dims.size(), kMaxDims);
    v.ndim = static_cast<int>(dims.size());
    int i = 0;
    for (auto d : dims) v.shape[i++] = d;
    std::int64_t s = 1;
    for (int j = v.ndim - 1; j >= 0; --j) {
      v.stride[j] = s;
      s *= v.shape[j];
    }
    return v;
  }

  bool empty_view() const { return data == nullptr; }
  std::int64_t dim(int i) const { return shape[i < 0 ? i + ndim : i]; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  bool is_contiguous() const {
    std::int64_t s = 1;
    for (int j = ndim - 1; j >= 0; --j) {
      if (shape[j] != 1 && stride[j] != s) return false;
      s *= shape[j];
    }
    return true;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  std::string shape_string() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

using TensorView = BasicTensorView<void*>;

struct ConstTensorView : BasicTensorView<const void*> {
  ConstTensorView() = default;
  ConstTensorView(const BasicTensorView<const void*>& v)  // NOLINT(google-explicit-constructor)
      : BasicTensorView<const void*>(v) {}
  ConstTensorView(const TensorView& v) {  // NOLINT(google-explicit-constructor)
    data = v.data;
    dtype = v.dtype;
    device = v.device;
    ndim = v.ndim;
    shape = v.shape;
    stride = v.stride;
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
};

}  // namespace ferry
