// SPDX-License-Identifier: Apache-2.0
// Helpers for the CUDA kernel tests (tests/gpu/kernels_*_test.cpp): the CUDA backend or a skip,
// device copies of host tensors (cudaMalloc directly: tests may include cuda_runtime.h), a CUDA
// stream, and the tolerance rule of style.md:
//   err(cuda) <= 2 * err(naive same-precision) + atol,  both errors measured against an f64
//   reference (reference_backend() on the same bf16-exact inputs).
// "naive" is stated per test: for an op that rounds once to its bf16 output it is the f64 result
// rounded to bf16; for attention it is a bf16 emulation of the textbook algorithm (S, P, dP, dS
// and outputs rounded to bf16, like PyTorch's math path in bf16).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "unit/kernels/kernel_test_util.h"

namespace ferry::testing {

// Host -> device copy that has landed when it returns. A plain cudaMemcpy from pageable host memory
// may return once the bytes are staged, before the DMA reaches the destination (CUDA runtime,
// "API synchronization behavior"), and it runs on the legacy default stream, which does not order
// the tests' non-blocking streams: a kernel launched right after could read (or write, and then
// be overwritten by) the bytes still in flight. Seen as allocation-history-dependent failures of
// kernel tests whose fresh buffers are uploaded zeros. Every test upload goes through here.
inline cudaError_t copy_to_device(void* dst, const void* src, std::size_t bytes) {
  const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

// Owning device copy of a HostTensor; view() points at device memory.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& h) : shape_(h.shape()), dtype_(h.dtype()) {
    bytes_ = static_cast<std::size_t>(h.numel()) * dtype_size(dtype_);
    EXPECT_EQ(cudaMalloc(&ptr_, bytes_ > 0 ? bytes_ : 1), cudaSuccess);
    if (bytes_ > 0) {
      EXPECT_EQ(copy_to_device(ptr_, h.data(), bytes_), cudaSuccess);
    }
  }
  DeviceTensor(std::vector<std::int64_t> shape, DType dt) : DeviceTensor(HostTensor(shape, dt)) {}
  DeviceTensor(DeviceTensor&& o) noexcept { *this = std::move(o); }
  DeviceTensor& operator=(DeviceTensor&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    shape_ = o.shape_;
    dtype_ = o.dtype_;
    return *this;
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  TensorView view() const {
    TensorView v;
    v.data = ptr_;
    v.dtype = dtype_;
    v.device = Device::kCuda;
    v.ndim = static_cast<int>(shape_.size());
    std::int64_t s = 1;
    for (int j = v.ndim - 1; j >= 0; --j) {
      v.shape[j] = shape_[static_cast<std::size_t>(j)];
      v.stride[j] = s;
      s *= v.shape[j];
    }
    return v;
  }
  ConstTensorView cview() const { return ConstTensorView(view()); }
  HostTensor download() const {
    HostTensor h(shape_, dtype_);
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(h.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return h;
  }
  void upload(const HostTensor& h) {
    ASSERT_EQ(static_cast<std::size_t>(h.numel()) * dtype_size(h.dtype()), bytes_);
    ASSERT_EQ(copy_to_device(ptr_, h.data(), bytes_), cudaSuccess);
  }
  void* data() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  std::vector<std::int64_t> shape_;
  DType dtype_ = DType::kF32;
};

// A fixture base: skips without a device; owns a CUDA stream.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    auto be = kernels::cuda_backend(0);
    ASSERT_TRUE(be.ok()) << be.status().to_string();
    backend_ = *be;
    ASSERT_EQ(cudaStreamCreateWithFlags(&raw_, cudaStreamNonBlocking), cudaSuccess);
    stream_ = mem::Stream(Device::kCuda, 0, raw_);
  }
  void TearDown() override {
    if (raw_ != nullptr) cudaStreamDestroy(raw_);
  }
  void sync() { ASSERT_EQ(cudaStreamSynchronize(raw_), cudaSuccess); }

  kernels::Backend& cuda() { return *backend_; }
  mem::Stream& stream() { return stream_; }
  // The fixture's stream is non-blocking: a plain cudaMemset (legacy default stream) may still be
  // running when a kernel on this stream writes the same buffer, so poison buffers here.
  cudaStream_t raw_stream() const { return raw_; }

 private:
  kernels::Backend* backend_ = nullptr;
  cudaStream_t raw_ = nullptr;
  mem::Stream stream_;
};

// Same values rounded to bf16 and back (what a kernel that rounds once at the end would give).
inline HostTensor rounded_to(const HostTensor& t, DType dt) {
  return converted(converted(t, dt), DType::kF64);
}

// err(got) <= 2 * err(naive) + atol, both against want.
inline ::testing::AssertionResult within_twice_naive(const HostTensor& got, const HostTensor& want,
                                                     const HostTensor& naive, double atol) {
  const double e = max_abs_diff(got, want);
  const double en = max_abs_diff(naive, want);
  if (e <= 2.0 * en + atol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "err " << e << " > 2 * naive err " << en << " + atol "
                                       << atol << " (max |want| " << max_abs(want) << ")";
}

inline bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.numel() == b.numel() && a.dtype() == b.dtype() &&
         std::memcmp(a.data(), b.data(),
                     static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

// A cudaMalloc'd copy of a host vector (at least 4 bytes, so an empty vector gets a valid pointer;
// the caller cudaFrees it) and a host copy of n device elements.
template <typename T>
T* device_copy(const std::vector<T>& h) {
  void* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<std::size_t>(h.size() * sizeof(T), 4)), cudaSuccess);
  EXPECT_EQ(copy_to_device(d, h.data(), h.size() * sizeof(T)), cudaSuccess);
  return static_cast<T*>(d);
}
template <typename T>
std::vector<T> host_copy(const T* d, std::size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// An owning cudaMalloc'd buffer (at least 16 bytes, so an empty one still has a valid, aligned
// pointer) for kernel tests, with typed upload/download helpers.
struct DeviceBuf {
  void* p = nullptr;
  explicit DeviceBuf(std::size_t bytes) {
    EXPECT_EQ(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)), cudaSuccess);
  }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  ~DeviceBuf() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};
template <typename T>
void up(void* d, const std::vector<T>& h) {
  ASSERT_EQ(copy_to_device(d, h.data(), h.size() * sizeof(T)), cudaSuccess);
}
template <typename T>
std::vector<T> down(const void* d, std::size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
template <typename A, typename B>
double max_abs_diff(const std::vector<A>& a, const std::vector<B>& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    e = std::max(e, std::fabs(double(a[i]) - double(b[i])));
  return e;
}
// A [3, E] expert pointer table (gate, up, down of each expert) over E experts laid out back to
// back from `base`, each three [F, C]-element matrices of `elem` bytes per element.
inline std::vector<const void*> expert_pointer_table(const std::byte* base, int E, std::int64_t F,
                                                     std::int64_t C, std::size_t elem) {
  const std::size_t mat = std::size_t(F * C) * elem;
  std::vector<const void*> t(std::size_t(3 * E));
  for (int e = 0; e < E; ++e) {
    const std::byte* b = base + std::size_t(e) * 3 * mat;
    t[std::size_t(e)] = b;
    t[std::size_t(E + e)] = b + mat;
    t[std::size_t(2 * E + e)] = b + 2 * mat;
  }
  return t;
}

}  // namespace ferry::testing
