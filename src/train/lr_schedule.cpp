// SPDX-License-Identifier: Apache-2.0
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace ferry::train {

Result<LrSchedule> parse_lr_schedule(std::string_view name) {
  if (name == "constant") return LrSchedule::kConstant;
  if (name == "cosine") return LrSchedule::kCosine;
  if (name == "linear") return LrSchedule::kLinear;
  return invalid_argument("train: unknown schedule '{}' (constant, cosine, linear)", name);
}

std::string_view to_string(LrSchedule s) {
  switch (s) {
    case LrSchedule::kConstant:
      return "constant";
    case LrSchedule::kCosine:
      return "cosine";
    case LrSchedule::kLinear:
      return "linear";
  }
  return "?";
}

double lr_at(const LrScheduleConfig& c, std::int64_t step) {
  if (c.warmup_steps > 0 && step <= c.warmup_steps) {
    return c.peak * static_cast<double>(step) / static_cast<double>(c.warmup_steps);
  }
  if (c.kind == LrSchedule::kConstant) return c.peak;
  const double min_lr = c.peak * c.min_lr_ratio;
  const std::int64_t span = c.total_steps - c.warmup_steps;
  const double p =
      span <= 0 ? 1.0
                : std::clamp(static_cast<double>(step - c.warmup_steps) / double(span), 0.0, 1.0);
  if (c.kind == LrSchedule::kLinear) return c.peak + (min_lr - c.peak) * p;
  return min_lr + (c.peak - min_lr) * 0.5 * (1.0 + std::cos(3.141592653589793 * p));
}

}  // namespace ferry::train
