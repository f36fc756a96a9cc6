// SPDX-License-Identifier: Apache-2.0
// Slot state machine: every legal transition is accepted, every other one aborts; PinnedRing
// hands slots out in ring order, recycles them only after end_use, and charges the pinned budget.
#include "mem/pinned_ring.h"

#include <cstdint>

#include <gtest/gtest.h>

namespace ferry::mem {
namespace {

constexpr SlotState kAll[] = {SlotState::kFree, SlotState::kLoading, SlotState::kReady,
                              SlotState::kInUse};

TEST(SlotState, ExactlyTheDocumentedTransitionsAreLegal) {
  int legal = 0;
  for (SlotState from : kAll) {
    for (SlotState to : kAll) legal += is_legal_transition(from, to);
  }
  EXPECT_EQ(legal, 5);
  EXPECT_TRUE(is_legal_transition(SlotState::kFree, SlotState::kLoading));
  EXPECT_TRUE(is_legal_transition(SlotState::kLoading, SlotState::kReady));
  EXPECT_TRUE(is_legal_transition(SlotState::kReady, SlotState::kInUse));
  EXPECT_TRUE(is_legal_transition(SlotState::kInUse, SlotState::kFree));
  EXPECT_TRUE(is_legal_transition(SlotState::kReady, SlotState::kFree));  // discard
  SlotState s = SlotState::kFree;
  for (SlotState to :
       {SlotState::kLoading, SlotState::kReady, SlotState::kInUse, SlotState::kFree}) {
    transition(s, to, 0);
    EXPECT_EQ(s, to);
  }
}

TEST(SlotStateDeathTest, EveryIllegalTransitionAborts) {
  for (SlotState from : kAll) {
    for (SlotState to : kAll) {
      if (is_legal_transition(from, to)) continue;
      SlotState s = from;
      EXPECT_DEATH(transition(s, to, 3),
                   fmt::format("illegal slot transition {} -> {} \\(slot 3\\)", to_string(from),
                               to_string(to)));
    }
  }
}

TEST(PinnedRing, CyclesSlotsInOrderAndRecyclesOnlyAfterEndUse) {
  MemoryBudget pin(MemTier::kPinnedHost, 1 << 20);
  auto r = PinnedRing::create({.slots = 3, .slot_bytes = 5000}, pin);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  PinnedRing& ring = *r;
  EXPECT_EQ(ring.slot_stride(), 8192u);
  EXPECT_EQ(pin.bytes_used(), 3u * 8192u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ring.data(i)) % 4096, 0u);
    auto s = ring.acquire();
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(*s, i);
    EXPECT_EQ(ring.state(i), SlotState::kLoading);
  }
  // Slot 0 is loading: the ring is too small for a 4th outstanding slot.
  auto none = ring.try_acquire();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto busy = ring.acquire();
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(busy.status().message().find("slot 0 of 3 is loading"), std::string::npos)
      << busy.status().message();

  ring.mark_ready(0);
  ring.begin_use(0);
  EXPECT_FALSE(ring.try_acquire()->has_value());  // in use, end_use not called yet
  ASSERT_TRUE(ring.end_use(0, Stream::host()).ok());
  EXPECT_EQ(ring.state(0), SlotState::kInUse);  // until reclaimed
  auto again = ring.acquire();                  // host event complete -> reclaimed
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0u);
  EXPECT_EQ(ring.state(0), SlotState::kLoading);

  ring.mark_ready(1);
  ring.discard(1);
  EXPECT_EQ(ring.state(1), SlotState::kFree);
  auto one = ring.acquire();
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, 1u);
}

TEST(PinnedRing, OutOfPinnedBudgetIsAStatus) {
  MemoryBudget pin(MemTier::kPinnedHost, 10000);
  auto r = PinnedRing::create({.slots = 2, .slot_bytes = 8192}, pin);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("pinned ring"), std::string::npos);
  EXPECT_EQ(pin.bytes_used(), 0u);
}

TEST(PinnedRingDeathTest, IllegalUseAborts) {
  MemoryBudget pin(MemTier::kPinnedHost);
  auto r = PinnedRing::create({.slots = 2, .slot_bytes = 64}, pin);
  ASSERT_TRUE(r.ok());
  EXPECT_DEATH(r->mark_ready(0), "illegal slot transition free -> ready");
  EXPECT_DEATH(r->begin_use(1), "illegal slot transition free -> in-use");
  EXPECT_DEATH((void)r->end_use(0, Stream::host()), "end_use on slot 0 in state free");
  EXPECT_DEATH(r->discard(0), "illegal slot transition free -> free");
}

}  // namespace
}  // namespace ferry::mem
