// SPDX-License-Identifier: Apache-2.0
// Buffer: budget charged on allocate and released on destruction/move/reset; out-of-budget is a
// resource_exhausted Status naming tier, request and free bytes; every host-visible tier is usable.
#include "mem/buffer.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include <gtest/gtest.h>

namespace ferry::mem {
namespace {

class BufferTiers : public ::testing::TestWithParam<MemTier> {};

TEST_P(BufferTiers, ChargesBudgetForItsLifetimeAndIsWritable) {
  const MemTier tier = GetParam();
  if (tier == MemTier::kDevice && !detail::device_tier_emulated()) {
    GTEST_SKIP() << "CUDA build: real device memory is covered by gpu_test";
  }
  MemoryBudget budget(tier, 1 << 20);
  {
    Result<Buffer> b = Buffer::allocate(tier, 10000, budget, {.what = "test"});
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(budget.bytes_used(), 10000u);
    EXPECT_EQ(b->size(), 10000u);
    EXPECT_EQ(b->tier(), tier);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b->data()) % 256, 0u);
    // Every tier here, including the emulated device tier, is host-addressable.
    std::memset(b->data(), 0xab, b->size());
    EXPECT_EQ(b->data()[9999], std::byte{0xab});
  }
  EXPECT_EQ(budget.bytes_used(), 0u);
  EXPECT_EQ(budget.bytes_peak(), 10000u);
}

INSTANTIATE_TEST_SUITE_P(All, BufferTiers,
                         ::testing::Values(MemTier::kPageableHost, MemTier::kPinnedHost,
                                           MemTier::kDevice),
                         [](const auto& param_info) {
                           std::string s(to_string(param_info.param));
                           for (char& c : s) c = c == '-' ? '_' : c;
                           return s;
                         });

TEST(Buffer, OutOfBudgetNamesTierRequestAndFree) {
  MemoryBudget budget(MemTier::kPinnedHost, 4096);
  Result<Buffer> a = Buffer::allocate(MemTier::kPinnedHost, 3000, budget);
  ASSERT_TRUE(a.ok());
  Result<Buffer> b =
      Buffer::allocate(MemTier::kPinnedHost, 2000, budget, {.what = "expert slot 7"});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  const std::string& m = b.status().message();
  EXPECT_NE(m.find("pinned-host"), std::string::npos) << m;
  EXPECT_NE(m.find("expert slot 7"), std::string::npos) << m;
  EXPECT_NE(m.find("need 2.0 KiB"), std::string::npos) << m;
  EXPECT_NE(m.find("free 1.1 KiB"), std::string::npos) << m;
  EXPECT_EQ(budget.bytes_used(), 3000u);  // the failed request left no charge behind
}

TEST(Buffer, MoveTransfersOwnershipAndChargeOnce) {
  MemoryBudget budget(MemTier::kPinnedHost);
  Result<Buffer> r = Buffer::allocate(MemTier::kPinnedHost, 5000, budget);
  ASSERT_TRUE(r.ok());
  Buffer a = std::move(r).value();
  std::byte* p = a.data();
  Buffer b = std::move(a);
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(budget.bytes_used(), 5000u);
  Result<Buffer> r2 = Buffer::allocate(MemTier::kPinnedHost, 100, budget);
  ASSERT_TRUE(r2.ok());
  b = std::move(r2).value();  // frees the 5000-byte buffer
  EXPECT_EQ(budget.bytes_used(), 100u);
  b.reset();
  EXPECT_EQ(budget.bytes_used(), 0u);
  EXPECT_TRUE(b.empty());
}

TEST(Buffer, RegisterModeIsExactSizeToo) {
  MemoryBudget budget(MemTier::kPinnedHost, 12345);
  Result<Buffer> b =
      Buffer::allocate(MemTier::kPinnedHost, 12345, budget, {.pinned_mode = PinnedMode::kRegister});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(budget.bytes_used(), 12345u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b->data()) % 4096, 0u);
}

TEST(Buffer, ZeroBytesIsEmptyAndFree) {
  MemoryBudget budget(MemTier::kPageableHost, 0);
  Result<Buffer> b = Buffer::allocate(MemTier::kPageableHost, 0, budget);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->empty());
  EXPECT_EQ(budget.bytes_used(), 0u);
}

TEST(Buffer, NonBufferTiersAreRefused) {
  MemoryBudget budget(MemTier::kNvme);
  Result<Buffer> b = Buffer::allocate(MemTier::kNvme, 10, budget);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
}

TEST(BufferDeathTest, BudgetOfAnotherTierIsABug) {
  MemoryBudget budget(MemTier::kPageableHost);
  EXPECT_DEATH((void)Buffer::allocate(MemTier::kDevice, 10, budget), "device buffer charged");
}

}  // namespace
}  // namespace ferry::mem
