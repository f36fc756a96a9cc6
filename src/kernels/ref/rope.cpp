// SPDX-License-Identifier: Apache-2.0
// Reference rotary embedding (Hugging Face rotate_half layout), in place on x [T, H, D]:
// for i < R/2, with angle = positions[t] * inv_freq[i] and s = attention_scaling,
//   x'[i] = (x[i] cos - x[i+R/2] sin) s,   x'[i+R/2] = (x[i+R/2] cos + x[i] sin) s,
// dims [R, D) pass through unchanged. backward applies s * rotation(-angle), the transpose, which
// is the gradient of the forward (dense_fd_test.cpp checks both facts).
// NOTE(kdense): angles are formed in f64 from the f32 inv_freq. Hugging Face multiplies in f32,
// so at large positions its angle carries a rounding error of up to ~pos * 2^-24 rad that ours
// does not; every ferry backend follows this f64 rule so backends agree with each other.
#include <cmath>

#include "kernels/ref/arg_checks.h"
#include "kernels/ref/element_access.h"
#include "kernels/ref/reference_backend.h"

namespace ferry::kernels {

Status ReferenceBackend::rope(const RopeArgs& a, Stream&) {
  constexpr std::string_view kWho = "reference rope";
  using namespace detail;
  FERRY_TRY(check_rank(kWho, "x", a.x, 3, kF32F64));
  const std::int64_t t_count = a.x.shape[0], h = a.x.shape[1], d = a.x.shape[2];
  FERRY_TRY(check_view(kWho, "positions", a.positions, {t_count}, kI32Only));
  FERRY_TRY(check_rank(kWho, "inv_freq", a.inv_freq, 1, kF32F64));
  const std::int64_t half = a.inv_freq.shape[0];
  if (2 * half > d) {
    return invalid_argument("kernels: {}: rotary dims {} (2 * inv_freq {}) exceed head dim {}",
                            kWho, 2 * half, half, d);
  }
  const double scale = a.attention_scaling;
  for (std::int64_t t = 0; t < t_count; ++t) {
    const double pos = ref::load_i32(a.positions, t);
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = pos * ref::load(a.inv_freq, i);
      const double c = std::cos(angle);
      const double s = a.backward ? -std::sin(angle) : std::sin(angle);
      for (std::int64_t head = 0; head < h; ++head) {
        const std::int64_t base = (t * h + head) * d;
        const double x1 = ref::load(a.x, base + i);
        const double x2 = ref::load(a.x, base + i + half);
        ref::store(a.x, base + i, (x1 * c - x2 * s) * scale);
        ref::store(a.x, base + i + half, (x2 * c + x1 * s) * scale);
      }
    }
  }
  return ok_status();
}

}  // namespace ferry::kernels
