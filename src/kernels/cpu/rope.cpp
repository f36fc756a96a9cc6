// SPDX-License-Identifier: Apache-2.0
// CPU rotary embedding (HF rotate_half layout), in place on x [T, H, D], f32 data, tokens split
// across threads. Same rule as ref/rope.cpp: the angle positions[t] * inv_freq[i] and its cos/sin
// are formed in f64 (then rounded to f32 once), so backends agree even at large positions;
// cos/sin are computed once per (token, pair) and applied to all H heads. backward uses the
// negated angle (the transpose). Dims [R, D) are untouched. Covered by dense_cpu_vs_ref_test.cpp.
#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ref/arg_checks.h"

namespace ferry::kernels {

Status CpuBackend::rope(const RopeArgs& a, Stream&) {
  constexpr std::string_view kWho = "cpu rope";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "x", a.x, 3, kF32Only));
  const std::int64_t t_count = a.x.shape[0], h = a.x.shape[1], d = a.x.shape[2];
  FERRY_TRY(check_view(kWho, "positions", a.positions, {t_count}, kI32Only));
  FERRY_TRY(check_rank(kWho, "inv_freq", a.inv_freq, 1, kF32Only));
  const std::int64_t half = a.inv_freq.shape[0];
  if (2 * half > d) {
    return invalid_argument("kernels: {}: rotary dims {} (2 * inv_freq {}) exceed head dim {}",
                            kWho, 2 * half, half, d);
  }
  const auto* pos = a.positions.as<std::int32_t>();
  const auto* inv_freq = a.inv_freq.as<float>();
  auto* x = a.x.as<float>();
  const float scale = a.attention_scaling;
  const double sign = a.backward ? -1.0 : 1.0;
  ThreadPool::global().parallel_for(
      static_cast<std::size_t>(t_count),
      [&](std::size_t t0, std::size_t t1) {
        for (auto t = static_cast<std::int64_t>(t0); t < static_cast<std::int64_t>(t1); ++t) {
          for (std::int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(pos[t]) * static_cast<double>(inv_freq[i]);
            const auto cs = static_cast<float>(std::cos(angle));
            const auto sn = static_cast<float>(sign * std::sin(angle));
            for (std::int64_t head = 0; head < h; ++head) {
              float* row = x + (t * h + head) * d;
              const float x1 = row[i], x2 = row[i + half];
              row[i] = (x1 * cs - x2 * sn) * scale;
              row[i + half] = (x2 * cs + x1 * sn) * scale;
            }
          }
        }
      },
      /*min_chunk=*/
      static_cast<std::size_t>(
          std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(1, h * half))));
  return ok_status();
}

}  // namespace ferry::kernels
