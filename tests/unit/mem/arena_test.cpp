// SPDX-License-Identifier: Apache-2.0
// ArenaPlan offsets/alignment, one allocation charged to the budget, views by SlotId, and
// out-of-budget as a Status.
#include "mem/arena.h"

#include <cstdint>
#include <cstring>

#include <gtest/gtest.h>

namespace ferry::mem {
namespace {

TEST(ArenaPlan, LaysOutSlotsInOrderAtTheirAlignment) {
  ArenaPlan plan;
  const SlotId a = plan.add("a", 10);          // [0, 10)
  const SlotId b = plan.add("b", 1000, 4096);  // [4096, 5096)
  const SlotId c = plan.add("c", 1, 64);       // [5120, 5121)
  const SlotId d = plan.add("d", 0, 512);      // [5632, 5632)
  const SlotId e = plan.add("e", 7, 1);        // [5632, 5639)
  EXPECT_EQ(plan.slot(a).offset_bytes, 0u);
  EXPECT_EQ(plan.slot(b).offset_bytes, 4096u);
  EXPECT_EQ(plan.slot(c).offset_bytes, 5120u);
  EXPECT_EQ(plan.slot(d).offset_bytes, 5632u);
  EXPECT_EQ(plan.slot(e).offset_bytes, 5632u);
  EXPECT_EQ(plan.total_bytes(), 5639u);
  EXPECT_EQ(plan.max_align(), 4096u);
  EXPECT_EQ(plan.allocation_bytes(), 5639u + 4096u - 256u);
  EXPECT_EQ(plan.find("c"), c);
  EXPECT_FALSE(plan.find("zz").has_value());
}

TEST(Arena, ChargesAllocationBytesOnceAndAlignsEverySlot) {
  ArenaPlan plan;
  const SlotId w = plan.add("weights", 3000, 8192);
  const SlotId x = plan.add("acts", 777, 256);
  const SlotId y = plan.add("scratch", 100, 128);
  MemoryBudget budget(MemTier::kPageableHost, 1 << 20);
  {
    Result<Arena> r = make_arena(plan, MemTier::kPageableHost, budget);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    Arena arena = std::move(r).value();
    EXPECT_EQ(budget.bytes_used(), plan.allocation_bytes());
    for (SlotId id : {w, x, y}) {
      const auto addr = reinterpret_cast<std::uintptr_t>(arena.data(id));
      EXPECT_EQ(addr % plan.slot(id).align_bytes, 0u) << plan.slot(id).name;
      EXPECT_GE(arena.data(id), arena.buffer().data());
      EXPECT_LE(arena.data(id) + arena.size(id), arena.buffer().data() + arena.buffer().size());
    }
    EXPECT_EQ(arena.data(x) - arena.base(), 3072);
    EXPECT_EQ(arena.size(x), 777u);
    // Slots are disjoint: writing each with its own byte leaves the others intact.
    std::memset(arena.data(w), 1, arena.size(w));
    std::memset(arena.data(x), 2, arena.size(x));
    std::memset(arena.data(y), 3, arena.size(y));
    EXPECT_EQ(arena.data(w)[2999], std::byte{1});
    EXPECT_EQ(arena.data(x)[0], std::byte{2});
    EXPECT_EQ(arena.data(x)[776], std::byte{2});
    EXPECT_EQ(arena.data(y)[0], std::byte{3});
    EXPECT_EQ(*arena.find("scratch"), y);
  }
  EXPECT_EQ(budget.bytes_used(), 0u);
}

TEST(Arena, OutOfBudgetIsResourceExhaustedWithTierRequestAndFree) {
  ArenaPlan plan;
  plan.add("kv", 1 << 20);
  MemoryBudget budget(MemTier::kPinnedHost, 1000);
  Result<Arena> r = make_arena(plan, MemTier::kPinnedHost, budget, {.what = "kv arena"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("pinned-host"), std::string::npos) << m;
  EXPECT_NE(m.find("kv arena"), std::string::npos) << m;
  EXPECT_NE(m.find("need 1.0 MiB"), std::string::npos) << m;
  EXPECT_NE(m.find("free 1000 B"), std::string::npos) << m;
  EXPECT_EQ(budget.bytes_used(), 0u);
}

TEST(ArenaDeathTest, PlanningBugsAbort) {
  ArenaPlan plan;
  plan.add("a", 1);
  EXPECT_DEATH(plan.add("a", 1), "duplicate slot name");
  EXPECT_DEATH(plan.add("b", 1, 48), "not a power of two");
  EXPECT_DEATH((void)plan.slot(SlotId{5}), "out of range");
}

}  // namespace
}  // namespace ferry::mem
