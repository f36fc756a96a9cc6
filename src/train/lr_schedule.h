// SPDX-License-Identifier: Apache-2.0
// Learning-rate schedules, as a pure function of the 1-based optimizer step:
//   constant:       lr(s) = peak (after warmup)
//   warmup:         lr(s) = peak * s / warmup            for s <= warmup (warmup > 0)
//   cosine:         lr(s) = min + (peak - min) * 0.5 * (1 + cos(pi * p)),  p = (s - warmup) /
//                   (total - warmup) clamped to [0, 1]
//   linear:         lr(s) = peak + (min - peak) * p
// min = peak * min_lr_ratio. Tests: tests/unit/train/lr_schedule_test.cpp.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/result.h"

namespace ferry::train {

enum class LrSchedule : unsigned char { kConstant, kCosine, kLinear };

Result<LrSchedule> parse_lr_schedule(std::string_view name);
std::string_view to_string(LrSchedule s);

struct LrScheduleConfig {
  LrSchedule kind = LrSchedule::kCosine;
  double peak = 1e-3;
  double min_lr_ratio = 0.1;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;
};

double lr_at(const LrScheduleConfig& c, std::int64_t step);

}  // namespace ferry::train
