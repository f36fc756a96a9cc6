// SPDX-License-Identifier: Apache-2.0
#include "mem/budget.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace ferry::mem {
namespace {

TEST(MemoryBudget, RefusesOverLimitNamingTierRequestAndFree) {
  MemoryBudget b(MemTier::kDevice, 1000);
  ASSERT_TRUE(b.reserve(600, "a").ok());
  const Status s = b.reserve(500, "expert slot");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("device"), std::string::npos);
  EXPECT_NE(s.message().find("expert slot"), std::string::npos);
  EXPECT_NE(s.message().find("free 400 B"), std::string::npos) << s.message();
  EXPECT_EQ(b.bytes_used(), 600u);
  b.release(600);
  EXPECT_EQ(b.bytes_used(), 0u);
  EXPECT_EQ(b.bytes_peak(), 600u);
}

TEST(MemoryBudget, ConcurrentReservationsNeverExceedLimit) {
  MemoryBudget b(MemTier::kPinnedHost, 10000);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        if (b.reserve(300, "t").ok()) {
          EXPECT_LE(b.bytes_used(), 10000u);
          b.release(300);
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(b.bytes_used(), 0u);
  EXPECT_LE(b.bytes_peak(), 10000u);
}

TEST(MemoryBudget, SetLimitBelowUseIsRefused) {
  MemoryBudget b(MemTier::kDevice, 100);
  ASSERT_TRUE(b.reserve(80, "x").ok());
  EXPECT_FALSE(b.set_limit(50).ok());
  EXPECT_TRUE(b.set_limit(90).ok());
  b.release(80);
}

}  // namespace
}  // namespace ferry::mem
