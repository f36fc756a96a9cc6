// SPDX-License-Identifier: Apache-2.0
// CPU gemm through OpenBLAS cblas_sgemm: out = alpha * op(a) @ op(b) + beta * out (+ bias).
// f32 only for now (bf16 weights return unimplemented: converting them would need a scratch
// buffer, and the Backend contract forbids allocating). Same conventions as ref/gemm.cpp:
// beta == 0 never reads out; bias is added once, unscaled; out must not alias a, b or bias.
// With a bias, out is first set to beta * out + bias and sgemm then runs with beta = 1.
// Covered by dense_cpu_vs_ref_test.cpp (swept shapes, all transpose / alpha / beta / bias cases).
#include <cblas.h>

#include <cstring>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ref/arg_checks.h"

namespace ferry::kernels {

Status CpuBackend::gemm(const GemmArgs& a, Stream&) {
  constexpr std::string_view kWho = "cpu gemm";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "out", a.out, 2, kF32Only));
  FERRY_TRY(check_rank(kWho, "a", a.a, 2, kF32Only));
  FERRY_TRY(check_rank(kWho, "b", a.b, 2, kF32Only));
  const std::int64_t m = a.out.shape[0], n = a.out.shape[1];
  const std::int64_t k = a.trans_a ? a.a.shape[0] : a.a.shape[1];
  if (a.trans_a) {
    FERRY_TRY(check_view(kWho, "a", a.a, {k, m}, kF32Only));
  } else {
    FERRY_TRY(check_view(kWho, "a", a.a, {m, k}, kF32Only));
  }
  if (a.trans_b) {
    FERRY_TRY(check_view(kWho, "b", a.b, {n, k}, kF32Only));
  } else {
    FERRY_TRY(check_view(kWho, "b", a.b, {k, n}, kF32Only));
  }
  FERRY_TRY(check_optional_view(kWho, "bias", a.bias, {n}, kF32Only));
  if (m == 0 || n == 0) return ok_status();

  auto* c = a.out.as<float>();
  float beta = a.beta;
  const bool has_bias = !is_absent(a.bias);
  if (has_bias || k == 0) {
    // out = beta * out (+ bias); the product is then added with beta = 1.
    const float* bias = has_bias ? a.bias.as<float>() : nullptr;
    const float b0 = a.beta;
    ThreadPool::global().parallel_for(
        static_cast<std::size_t>(m),
        [&](std::size_t r0, std::size_t r1) {
          for (std::size_t r = r0; r < r1; ++r) {
            float* row = c + static_cast<std::int64_t>(r) * n;
            for (std::int64_t j = 0; j < n; ++j) {
              const float base = b0 == 0.0f ? 0.0f : b0 * row[j];
              row[j] = bias != nullptr ? base + bias[j] : base;
            }
          }
        },
        /*min_chunk=*/static_cast<std::size_t>(std::max<std::int64_t>(1, 16384 / n)));
    beta = 1.0f;
  }
  if (k == 0) return ok_status();  // op(a) @ op(b) is all zeros
  cblas_sgemm(CblasRowMajor, a.trans_a ? CblasTrans : CblasNoTrans,
              a.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), a.alpha, a.a.as<float>(),
              static_cast<blasint>(a.a.shape[1]), a.b.as<float>(),
              static_cast<blasint>(a.b.shape[1]), beta, c, static_cast<blasint>(n));
  return ok_status();
}

}  // namespace ferry::kernels
