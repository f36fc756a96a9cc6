// SPDX-License-Identifier: Apache-2.0
// CPU AdamW step (ops.h formula, f32, SIMD span kernel of simd_adamw.cpp over thread chunks,
// optional bf16 write-out) and sum of squares (f64 accumulation over 64 fixed blocks, so the
// result does not depend on the thread count). Same argument rules as ref/optimizer.cpp.
// Covered by adamw_step_test.cpp and dense_cpu_vs_ref_test.cpp.
#include <algorithm>
#include <array>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/simd_kernels.h"
#include "kernels/ref/arg_checks.h"

namespace ferry::kernels {

Status CpuBackend::adamw(const AdamWArgs& a, Stream&) {
  constexpr std::string_view kWho = "cpu adamw";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "param", a.param, 1, kF32Only));
  const std::int64_t n = a.param.shape[0];
  FERRY_TRY(check_view(kWho, "m", a.m, {n}, kF32Only));
  FERRY_TRY(check_view(kWho, "v", a.v, {n}, kF32Only));
  FERRY_TRY(check_view(kWho, "grad", a.grad, {n}, kF32Only));
  FERRY_TRY(check_optional_view(kWho, "param_bf16", a.param_bf16, {n}, kBf16Only));
  if (a.step < 1)
    return invalid_argument("kernels: {}: step {} < 1 (steps are 1-based)", kWho, a.step);
  if (!(a.beta1 >= 0.0f && a.beta1 < 1.0f) || !(a.beta2 >= 0.0f && a.beta2 < 1.0f)) {
    return invalid_argument("kernels: {}: betas ({}, {}) must lie in [0, 1)", kWho, a.beta1,
                            a.beta2);
  }
  const cpu::AdamWConstants k = cpu::make_adamw_constants(a.lr, a.beta1, a.beta2, a.eps,
                                                          a.weight_decay, a.grad_scale, a.step);
  const cpu::Isa isa = cpu::best_isa();
  auto* p = a.param.as<float>();
  auto* m = a.m.as<float>();
  auto* v = a.v.as<float>();
  auto* p16 = is_absent(a.param_bf16) ? nullptr : a.param_bf16.as<std::uint16_t>();
  const auto* g = a.grad.as<float>();
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(n),
      [&](std::size_t b, std::size_t e) {
        cpu::adamw_span(isa, k, p + b, m + b, v + b, p16 == nullptr ? nullptr : p16 + b, g + b,
                        static_cast<std::int64_t>(e - b));
      },
      /*min_chunk=*/16384);
  return ok_status();
}

Status CpuBackend::sum_squares(const SumSquaresArgs& a, Stream&) {
  constexpr std::string_view kWho = "cpu sum_squares";
  using namespace detail;
  FERRY_TRY(check_view(kWho, "out", a.out, {1}, kF32Only));
  if (is_absent(a.x)) return invalid_argument("kernels: {}: required argument x is missing", kWho);
  FERRY_TRY(check_rank(kWho, "x", a.x, a.x.ndim, kF32Only));
  const std::int64_t n = a.x.numel();
  const auto* x = a.x.as<float>();
  constexpr std::int64_t kBlocks = 64;
  const std::int64_t per_block = (n + kBlocks - 1) / kBlocks;
  std::array<double, kBlocks> partial{};
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(kBlocks),
      [&](std::size_t b0, std::size_t b1) {
        for (auto b = static_cast<std::int64_t>(b0); b < static_cast<std::int64_t>(b1); ++b) {
          const std::int64_t i0 = b * per_block, i1 = std::min(n, i0 + per_block);
          double s = 0.0;
          for (std::int64_t i = i0; i < i1; ++i) s += static_cast<double>(x[i]) * x[i];
          partial[static_cast<std::size_t>(b)] = s;
        }
      },
      /*min_chunk=*/
      static_cast<std::size_t>(
          std::max<std::int64_t>(1, kBlocks * 8192 / std::max<std::int64_t>(1, n))));
  double total = 0.0;
  for (double s : partial) total += s;
  a.out.as<float>()[0] = static_cast<float>(total);
  return ok_status();
}

}  // namespace ferry::kernels
