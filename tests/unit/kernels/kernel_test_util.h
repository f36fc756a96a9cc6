// SPDX-License-Identifier: Apache-2.0
// Shared helpers for kernel tests: an owning host tensor (bytes + view), seeded random tensors,
// element access in any float dtype through f64, max-abs / relative diffs, the llm.c tolerance
// rule (|got - want| <= atol + |want| * rtol) and a central-difference gradient checker driven by
// a scalar loss lambda. Header-only so every tests/unit/kernels/*_test.cpp can include it.
//
//   auto x = testing::random_tensor({7, 13}, DType::kF64, /*seed=*/1);
//   auto loss = [&] { run_forward(x); return testing::dot(out, proj); };
//   EXPECT_TRUE(testing::check_gradient(x, analytic_dx, loss));
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "tensor/tensor_view.h"

// Fails the current test (fatally) with the Status text when expr is not ok.
#define FERRY_ASSERT_OK(expr)                                              \
  do {                                                                     \
    const ::ferry::Status ferry_ts_ = (expr);                              \
    ASSERT_TRUE(ferry_ts_.ok()) << #expr << ": " << ferry_ts_.to_string(); \
  } while (0)
#define FERRY_EXPECT_OK(expr)                                              \
  do {                                                                     \
    const ::ferry::Status ferry_ts_ = (expr);                              \
    EXPECT_TRUE(ferry_ts_.ok()) << #expr << ": " << ferry_ts_.to_string(); \
  } while (0)

namespace ferry::testing {

// An owning, contiguous host tensor. Storage is 64-byte aligned (over-allocated vector).
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(std::vector<std::int64_t> shape, DType dt) : shape_(std::move(shape)), dtype_(dt) {
    FERRY_CHECK(shape_.size() <= static_cast<std::size_t>(kMaxDims), "test tensor: too many dims");
    numel_ = 1;
    for (auto d : shape_) numel_ *= d;
    storage_.assign(static_cast<std::size_t>(numel_) * dtype_size(dt) + 64, std::byte{0});
  }
  // Copies share nothing. The aligned offset into storage_ can differ between two vectors, so
  // copying goes element bytes to element bytes (a moved vector keeps its buffer and offset).
  HostTensor(const HostTensor& o) : HostTensor(o.shape_, o.dtype_) {
    std::memcpy(data(), o.data(), static_cast<std::size_t>(numel_) * dtype_size(dtype_));
  }
  HostTensor& operator=(const HostTensor& o) {
    if (this != &o) *this = HostTensor(o);
    return *this;
  }
  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;

  void* data() {
    auto p = reinterpret_cast<std::uintptr_t>(storage_.data());
    return storage_.data() + ((64 - p % 64) % 64);
  }
  const void* data() const { return const_cast<HostTensor*>(this)->data(); }
  DType dtype() const { return dtype_; }
  std::int64_t numel() const { return numel_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }

  TensorView view() {
    TensorView v;
    v.data = data();
    v.dtype = dtype_;
    v.device = Device::kCpu;
    v.ndim = static_cast<int>(shape_.size());
    std::int64_t s = 1;
    for (int j = v.ndim - 1; j >= 0; --j) {
      v.shape[j] = shape_[j];
      v.stride[j] = s;
      s *= shape_[j];
    }
    return v;
  }
  ConstTensorView cview() const { return ConstTensorView(const_cast<HostTensor*>(this)->view()); }

  double get(std::int64_t i) const {
    const void* p = data();
    switch (dtype_) {
      case DType::kF32:
        return static_cast<const float*>(p)[i];
      case DType::kF64:
        return static_cast<const double*>(p)[i];
      case DType::kBF16:
        return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
      case DType::kF16:
        return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
      case DType::kI32:
        return static_cast<const std::int32_t*>(p)[i];
      case DType::kI64:
        return static_cast<double>(static_cast<const std::int64_t*>(p)[i]);
      default:
        FERRY_CHECK(false, "test tensor: get() on {}", to_string(dtype_));
    }
    return 0.0;
  }
  void set(std::int64_t i, double x) {
    void* p = data();
    switch (dtype_) {
      case DType::kF32:
        static_cast<float*>(p)[i] = static_cast<float>(x);
        break;
      case DType::kF64:
        static_cast<double*>(p)[i] = x;
        break;
      case DType::kBF16:
        static_cast<std::uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(x));
        break;
      case DType::kF16:
        static_cast<std::uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(x));
        break;
      case DType::kI32:
        static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(x);
        break;
      case DType::kI64:
        static_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(x);
        break;
      default:
        FERRY_CHECK(false, "test tensor: set() on {}", to_string(dtype_));
    }
  }
  std::vector<double> to_f64() const {
    std::vector<double> out(static_cast<std::size_t>(numel_));
    for (std::int64_t i = 0; i < numel_; ++i) out[static_cast<std::size_t>(i)] = get(i);
    return out;
  }
  void fill(double x) {
    for (std::int64_t i = 0; i < numel_; ++i) set(i, x);
  }

 private:
  std::vector<std::int64_t> shape_;
  DType dtype_ = DType::kF32;
  std::int64_t numel_ = 0;
  std::vector<std::byte> storage_;
};

inline HostTensor zeros(std::vector<std::int64_t> shape, DType dt) {
  return HostTensor(std::move(shape), dt);
}

// Uniform in [lo, hi), deterministic for a seed; values are rounded to the dtype.
inline HostTensor random_tensor(std::vector<std::int64_t> shape, DType dt, std::uint64_t seed,
                                double lo = -1.0, double hi = 1.0) {
  HostTensor t(std::move(shape), dt);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, u(rng));
  return t;
}

inline HostTensor from_values(std::vector<std::int64_t> shape, DType dt,
                              const std::vector<double>& values) {
  HostTensor t(std::move(shape), dt);
  FERRY_CHECK(static_cast<std::int64_t>(values.size()) == t.numel(),
              "test tensor: {} values for {}", values.size(), t.numel());
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, values[static_cast<std::size_t>(i)]);
  return t;
}

// i32 ids, uniform in [0, upper).
inline HostTensor random_ids(std::int64_t n, std::int64_t upper, std::uint64_t seed) {
  HostTensor t({n}, DType::kI32);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> u(0, upper - 1);
  for (std::int64_t i = 0; i < n; ++i) t.set(i, static_cast<double>(u(rng)));
  return t;
}

// Same values in another dtype (rounded on narrowing).
inline HostTensor converted(const HostTensor& t, DType dt) {
  HostTensor out(t.shape(), dt);
  for (std::int64_t i = 0; i < t.numel(); ++i) out.set(i, t.get(i));
  return out;
}

inline double max_abs_diff(const HostTensor& a, const HostTensor& b) {
  FERRY_CHECK(a.numel() == b.numel(), "test: numel {} vs {}", a.numel(), b.numel());
  double m = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.get(i) - b.get(i)));
  return m;
}

inline double max_abs(const HostTensor& a) {
  double m = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.get(i)));
  return m;
}

// Largest |a - b| / max(|b|, floor): relative to the reference b.
inline double max_rel_diff(const HostTensor& a, const HostTensor& b, double floor = 1e-12) {
  FERRY_CHECK(a.numel() == b.numel(), "test: numel {} vs {}", a.numel(), b.numel());
  double m = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(a.get(i) - b.get(i)) / std::max(std::fabs(b.get(i)), floor));
  return m;
}

// Unit roundoff of a dtype (half the gap between 1 and the next value).
inline double eps_of(DType dt) {
  switch (dt) {
    case DType::kF64:
      return 0x1p-53;
    case DType::kF32:
      return 0x1p-24;
    case DType::kBF16:
      return 0x1p-8;
    case DType::kF16:
      return 0x1p-11;
    default:
      return 0.0;
  }
}

// llm.c rule: every element satisfies |got - want| <= atol + |want| * rtol. On failure the
// message names the worst element (by excess over its bound) and the count of violations.
inline ::testing::AssertionResult all_close(const HostTensor& got, const HostTensor& want,
                                            double atol, double rtol) {
  if (got.numel() != want.numel())
    return ::testing::AssertionFailure() << "numel " << got.numel() << " vs " << want.numel();
  std::int64_t bad = 0, worst = -1;
  double worst_excess = 0.0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    const double bound = atol + std::fabs(w) * rtol;
    const double err = std::fabs(g - w);
    if (!(err <= bound)) {  // NaN counts as a failure
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err - bound;
      if (worst < 0 || excess > worst_excess) worst = i, worst_excess = excess;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(10);
  os << bad << " of " << got.numel() << " elements out of tolerance (atol " << atol << ", rtol "
     << rtol << "); worst at " << worst << ": got " << got.get(worst) << " want "
     << want.get(worst);
  return ::testing::AssertionFailure() << os.str();
}

// sum_i a[i] * w[i] in f64: the usual "random projection" scalar loss for gradient checks
// (d loss / d a = w).
inline double dot(const HostTensor& a, const HostTensor& w) {
  FERRY_CHECK(a.numel() == w.numel(), "test: numel {} vs {}", a.numel(), w.numel());
  double s = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += a.get(i) * w.get(i);
  return s;
}

// Central differences of loss() with respect to every element of x (x is perturbed in place and
// restored). loss() must read x's current values (capture it by reference).
inline std::vector<double> numeric_gradient(HostTensor& x, const std::function<double()>& loss,
                                            double h = 1e-6) {
  std::vector<double> g(static_cast<std::size_t>(x.numel()));
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double x0 = x.get(i);
    x.set(i, x0 + h);
    const double lp = loss();
    x.set(i, x0 - h);
    const double lm = loss();
    x.set(i, x0);
    g[static_cast<std::size_t>(i)] = (lp - lm) / (2.0 * h);
  }
  return g;
}

// Compares an analytic gradient against central differences: every element must satisfy
// |analytic - numeric| <= rel_tol * max(|analytic|, |numeric|) + abs_tol. Use f64 tensors: with
// h = 1e-6 the truncation error is O(h^2 |f'''|) ~ 1e-12 and the cancellation error
// O(eps_f64 |f| / h) ~ 1e-10 |f|, so rel_tol 1e-6 leaves a wide margin while any real
// mistake (a missing term, a wrong sign) gives O(1) relative error.
inline ::testing::AssertionResult check_gradient(HostTensor& x, const HostTensor& analytic,
                                                 const std::function<double()>& loss,
                                                 double rel_tol = 1e-6, double abs_tol = 1e-9,
                                                 double h = 1e-6) {
  if (x.numel() != analytic.numel())
    return ::testing::AssertionFailure()
           << "gradient numel " << analytic.numel() << " vs input " << x.numel();
  const std::vector<double> num = numeric_gradient(x, loss, h);
  std::int64_t bad = 0, worst = -1;
  double worst_rel = 0.0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double a = analytic.get(i), n = num[static_cast<std::size_t>(i)];
    const double err = std::fabs(a - n);
    const double bound = rel_tol * std::max(std::fabs(a), std::fabs(n)) + abs_tol;
    if (!(err <= bound)) {
      ++bad;
      const double rel = err / std::max({std::fabs(a), std::fabs(n), 1e-300});
      if (worst < 0 || rel > worst_rel) worst = i, worst_rel = rel;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(12);
  os << bad << " of " << x.numel() << " gradient elements differ; worst at " << worst
     << ": analytic " << analytic.get(worst) << " numeric " << num[static_cast<std::size_t>(worst)]
     << " (rel " << worst_rel << ")";
  return ::testing::AssertionFailure() << os.str();
}

}  // namespace ferry::testing
