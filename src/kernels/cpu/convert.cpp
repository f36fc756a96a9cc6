// SPDX-License-Identifier: Apache-2.0
// CPU dtype conversion between f32 and bf16 (round to nearest even, core/dtype.h's f32_to_bf16),
// threaded; equal dtypes copy. Covered by dense_cpu_vs_ref_test.cpp (bit-equal to the reference).
#include <cstring>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ref/arg_checks.h"

namespace ferry::kernels {

Status CpuBackend::convert(const ConvertArgs& a, Stream&) {
  constexpr std::string_view kWho = "cpu convert";
  using namespace detail;
  constexpr DTypeSet kF32Bf16{DType::kF32, DType::kBF16};
  if (is_absent(a.out) || is_absent(a.in))
    return invalid_argument("kernels: {}: out and in are required", kWho);
  FERRY_TRY(check_rank(kWho, "out", a.out, a.out.ndim, kF32Bf16));
  FERRY_TRY(check_rank(kWho, "in", a.in, a.in.ndim, kF32Bf16));
  if (a.in.numel() != a.out.numel()) {
    return invalid_argument("kernels: {}: in {} and out {} differ in element count", kWho,
                            a.in.shape_string(), a.out.shape_string());
  }
  const auto n = static_cast<std::size_t>(a.out.numel());
  if (a.in.dtype == a.out.dtype) {
    if (n > 0) std::memmove(a.out.data, a.in.data, a.out.bytes());
    return ok_status();
  }
  const bool to_bf16 = a.out.dtype == DType::kBF16;
  ThreadPool::global().parallel_for(
      n,
      [&](std::size_t b, std::size_t e) {
        if (to_bf16) {
          const auto* in = a.in.as<float>();
          auto* out = a.out.as<std::uint16_t>();
          for (std::size_t i = b; i < e; ++i) out[i] = f32_to_bf16(in[i]);
        } else {
          const auto* in = a.in.as<std::uint16_t>();
          auto* out = a.out.as<float>();
          for (std::size_t i = b; i < e; ++i) out[i] = bf16_to_f32(in[i]);
        }
      },
      /*min_chunk=*/32768);
  return ok_status();
}

}  // namespace ferry::kernels
