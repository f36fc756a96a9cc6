// SPDX-License-Identifier: Apache-2.0
// CPU RMSNorm forward and backward, f32: rows split across ThreadPool::global(), each row done by
// the SIMD row kernels of simd_rms_norm.cpp (variant from best_isa()). The weight gradient is a
// reduction over rows, done in a second pass split by columns: each thread sums its columns over
// all rows in f64 (in row order) and adds the total into d_weight once, so the result does not
// depend on the thread count. The forward's optional bf16 copy (out16) rounds each row as just
// written with convert()'s f32_to_bf16, so it equals convert(out) bit for bit. Covered by
// dense_cpu_vs_ref_test.cpp.
#include <algorithm>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/simd_kernels.h"
#include "kernels/ref/arg_checks.h"

namespace ferry::kernels {
namespace {

// Rows per chunk so a chunk holds at least ~16k elements (thread hand-off costs microseconds).
std::size_t rows_per_chunk(std::int64_t c) {
  return static_cast<std::size_t>(std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(1, c)));
}

}  // namespace

Status CpuBackend::rms_norm(const RmsNormArgs& a, Stream&) {
  constexpr std::string_view kWho = "cpu rms_norm";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "in", a.in, 2, kF32Only));
  const std::int64_t n = a.in.shape[0], c = a.in.shape[1];
  FERRY_TRY(check_view(kWho, "out", a.out, {n, c}, kF32Only));
  FERRY_TRY(check_view(kWho, "weight", a.weight, {c}, kF32Only));
  FERRY_TRY(check_optional_view(kWho, "rstd", a.rstd, {n}, kF32Only));
  FERRY_TRY(check_optional_view(kWho, "out16", a.out16, {n, c}, kBf16Only));
  const cpu::Isa isa = cpu::best_isa();
  const auto* in = a.in.as<float>();
  const auto* w = a.weight.as<float>();
  auto* out = a.out.as<float>();
  auto* rstd = is_absent(a.rstd) ? nullptr : a.rstd.as<float>();
  auto* out16 = is_absent(a.out16) ? nullptr : a.out16.as<std::uint16_t>();
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(n),
      [&](std::size_t r0, std::size_t r1) {
        for (auto r = static_cast<std::int64_t>(r0); r < static_cast<std::int64_t>(r1); ++r) {
          const float rs = cpu::rms_norm_row(isa, out + r * c, in + r * c, w, c, a.eps);
          if (rstd != nullptr) rstd[r] = rs;
          // The bf16 copy from the f32 row just written (still in cache): convert()'s rounding.
          if (out16 != nullptr) {
            for (std::int64_t j = r * c; j < (r + 1) * c; ++j) out16[j] = f32_to_bf16(out[j]);
          }
        }
      },
      rows_per_chunk(c));
  return ok_status();
}

Status CpuBackend::rms_norm_backward(const RmsNormBackwardArgs& a, Stream&) {
  constexpr std::string_view kWho = "cpu rms_norm_backward";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "in", a.in, 2, kF32Only));
  const std::int64_t n = a.in.shape[0], c = a.in.shape[1];
  FERRY_TRY(check_view(kWho, "d_in", a.d_in, {n, c}, kF32Only));
  FERRY_TRY(check_view(kWho, "d_weight", a.d_weight, {c}, kF32Only));
  FERRY_TRY(check_view(kWho, "d_out", a.d_out, {n, c}, kF32Only));
  FERRY_TRY(check_view(kWho, "weight", a.weight, {c}, kF32Only));
  FERRY_TRY(check_view(kWho, "rstd", a.rstd, {n}, kF32Only));
  const cpu::Isa isa = cpu::best_isa();
  const auto* x = a.in.as<float>();
  const auto* dy = a.d_out.as<float>();
  const auto* w = a.weight.as<float>();
  const auto* rstd = a.rstd.as<float>();
  auto* d_in = a.d_in.as<float>();
  auto* d_w = a.d_weight.as<float>();
  auto& pool = ThreadPool::global();
  pool.parallel_for(
      static_cast<std::size_t>(n),
      [&](std::size_t r0, std::size_t r1) {
        for (auto r = static_cast<std::int64_t>(r0); r < static_cast<std::int64_t>(r1); ++r)
          cpu::rms_norm_backward_row(isa, d_in + r * c, dy + r * c, x + r * c, w, rstd[r], c);
      },
      rows_per_chunk(c));
  // d_weight[j] += sum_r dy[r, j] * x[r, j] * rstd[r], columns in blocks of kBlock.
  constexpr std::int64_t kBlock = 64;
  const std::int64_t blocks = (c + kBlock - 1) / kBlock;
  pool.parallel_for(
      static_cast<std::size_t>(blocks),
      [&](std::size_t b0, std::size_t b1) {
        for (auto b = static_cast<std::int64_t>(b0); b < static_cast<std::int64_t>(b1); ++b) {
          const std::int64_t j0 = b * kBlock, j1 = std::min(c, j0 + kBlock);
          double acc[kBlock] = {};
          for (std::int64_t r = 0; r < n; ++r) {
            const double rs = rstd[r];
            for (std::int64_t j = j0; j < j1; ++j)
              acc[j - j0] += static_cast<double>(dy[r * c + j]) * x[r * c + j] * rs;
          }
          for (std::int64_t j = j0; j < j1; ++j) d_w[j] = static_cast<float>(d_w[j] + acc[j - j0]);
        }
      },
      /*min_chunk=*/
      static_cast<std::size_t>(std::max<std::int64_t>(1, 256 / std::max<std::int64_t>(1, n))));
  return ok_status();
}

}  // namespace ferry::kernels
