// SPDX-License-Identifier: Apache-2.0
// CPU elementwise add, f32, any rank <= 4, threaded. out may alias a or b exactly (element i is
// read before it is written). Covered by dense_cpu_vs_ref_test.cpp.
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ref/arg_checks.h"

namespace ferry::kernels {

Status CpuBackend::add(const AddArgs& a, Stream&) {
  constexpr std::string_view kWho = "cpu add";
  using namespace detail;
  if (is_absent(a.out))
    return invalid_argument("kernels: {}: required argument out is missing", kWho);
  FERRY_TRY(check_rank(kWho, "out", a.out, a.out.ndim, kF32Only));
  FERRY_TRY(check_rank(kWho, "a", a.a, a.out.ndim, kF32Only));
  FERRY_TRY(check_rank(kWho, "b", a.b, a.out.ndim, kF32Only));
  for (int i = 0; i < a.out.ndim; ++i) {
    if (a.a.shape[i] != a.out.shape[i] || a.b.shape[i] != a.out.shape[i]) {
      return invalid_argument("kernels: {}: shapes differ: out {}, a {}, b {}", kWho,
                              a.out.shape_string(), a.a.shape_string(), a.b.shape_string());
    }
  }
  const auto* x = a.a.as<float>();
  const auto* y = a.b.as<float>();
  auto* out = a.out.as<float>();
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(a.out.numel()),
      [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) out[i] = x[i] + y[i];
      },
      /*min_chunk=*/32768);
  return ok_status();
}

}  // namespace ferry::kernels
