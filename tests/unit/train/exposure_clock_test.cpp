// SPDX-License-Identifier: Apache-2.0
// ExposureClock on host compute: waits add to the total and to the open window, windows get
// their wall time, collect() hands them over once and starts from zero. (The GPU mode, events on
// the compute stream, is exercised by tests/gpu/train_stream_gpu_test.cpp.)
#include "train/stream/exposure_clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace ferry::train::stream {
namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(ExposureClock, HostWaitsGoToTheTotalAndTheOpenWindow) {
  auto c = ExposureClock::create(nullptr, 4, 3);
  ASSERT_TRUE(c.ok());
  ExposureClock& clock = **c;
  EXPECT_FALSE(clock.on_gpu());
  clock.begin_micro_batch();
  ASSERT_TRUE(clock.wait_begin().ok());  // outside any window: the total only
  sleep_ms(4);
  ASSERT_TRUE(clock.wait_end().ok());
  ASSERT_TRUE(clock.window_begin(2).ok());
  sleep_ms(3);
  ASSERT_TRUE(clock.wait_begin().ok());
  sleep_ms(6);
  ASSERT_TRUE(clock.wait_end().ok());
  ASSERT_TRUE(clock.window_end().ok());
  double exposed = 0.0;
  std::vector<double> win(3, 0.0), win_exposed(3, 0.0);
  ASSERT_TRUE(clock.collect(&exposed, win, win_exposed).ok());
  EXPECT_GE(exposed, 0.010);
  EXPECT_GE(win_exposed[2], 0.006);
  EXPECT_LT(win_exposed[2], exposed);  // the first wait was in no window
  EXPECT_GE(win[2], 0.009);            // the window's wall time covers its wait and the rest
  EXPECT_GE(win[2], win_exposed[2]);
  EXPECT_EQ(win[0], 0.0);
  EXPECT_EQ(win_exposed[1], 0.0);
  // Collected once: a second collect adds nothing.
  const double before = exposed;
  ASSERT_TRUE(clock.collect(&exposed, win, win_exposed).ok());
  EXPECT_EQ(exposed, before);
}

TEST(ExposureClock, NestedWaitIsABug) {
  auto c = ExposureClock::create(nullptr, 4, 1);
  ASSERT_TRUE(c.ok());
  ExposureClock& clock = **c;
  clock.begin_micro_batch();
  ASSERT_TRUE(clock.wait_begin().ok());
  EXPECT_DEATH((void)clock.wait_begin(), "nested exposure waits");
}

}  // namespace
}  // namespace ferry::train::stream
