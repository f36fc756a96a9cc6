// SPDX-License-Identifier: Apache-2.0
// LR schedule values at steps where they can be computed by hand.
#include "train/lr_schedule.h"

#include <gtest/gtest.h>

namespace ferry::train {
namespace {

LrScheduleConfig cfg(LrSchedule k) {
  return {.kind = k, .peak = 1.0, .min_lr_ratio = 0.1, .warmup_steps = 10, .total_steps = 110};
}

TEST(LrSchedule, WarmupIsLinearFromZero) {
  for (LrSchedule k : {LrSchedule::kConstant, LrSchedule::kCosine, LrSchedule::kLinear}) {
    EXPECT_DOUBLE_EQ(lr_at(cfg(k), 1), 0.1);
    EXPECT_DOUBLE_EQ(lr_at(cfg(k), 5), 0.5);
    EXPECT_DOUBLE_EQ(lr_at(cfg(k), 10), 1.0);
  }
}

TEST(LrSchedule, ConstantAfterWarmup) {
  EXPECT_DOUBLE_EQ(lr_at(cfg(LrSchedule::kConstant), 11), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(cfg(LrSchedule::kConstant), 500), 1.0);
}

TEST(LrSchedule, CosineHalfwayAndEnd) {
  // p = (60 - 10) / 100 = 0.5: 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55.
  EXPECT_NEAR(lr_at(cfg(LrSchedule::kCosine), 60), 0.55, 1e-12);
  // p = 0.25: 0.1 + 0.45 * (1 + sqrt(2)/2) = 0.868198...
  EXPECT_NEAR(lr_at(cfg(LrSchedule::kCosine), 35), 0.1 + 0.45 * (1.0 + 0.7071067811865476), 1e-12);
  EXPECT_NEAR(lr_at(cfg(LrSchedule::kCosine), 110), 0.1, 1e-12);
  EXPECT_NEAR(lr_at(cfg(LrSchedule::kCosine), 200), 0.1, 1e-12);  // clamped past the end
}

TEST(LrSchedule, LinearQuarterAndEnd) {
  EXPECT_NEAR(lr_at(cfg(LrSchedule::kLinear), 35), 0.775, 1e-12);  // 1 - 0.9 * 0.25
  EXPECT_NEAR(lr_at(cfg(LrSchedule::kLinear), 110), 0.1, 1e-12);
}

TEST(LrSchedule, ParseNames) {
  EXPECT_EQ(*parse_lr_schedule("linear"), LrSchedule::kLinear);
  EXPECT_FALSE(parse_lr_schedule("step").ok());
}

}  // namespace
}  // namespace ferry::train
