// SPDX-License-Identifier: Apache-2.0
// GPU: device-tier Buffers/Arenas filled and verified by the pattern kernels (mem/cuda/*.cu),
// pinned H2D/D2H round trips through the CUDA transfer engine ordered by events, and device
// out-of-memory / out-of-budget as Status. Skips without a CUDA device.
#include <cstdint>
#include <cstring>

#include <gtest/gtest.h>

#include "mem/arena.h"
#include "mem/buffer.h"
#include "mem/device_info.h"
#include "mem/device_pattern.h"
#include "mem/event.h"
#include "mem/pinned_ring.h"
#include "mem/stream_set.h"
#include "mem/transfer_engine.h"
#include "tests/gpu/mem_gpu_fixture.h"

namespace ferry::mem {
namespace {

class MemGpu : public testing::MemGpuFixture {};

TEST_F(MemGpu, DeviceBufferFillVerifyAndCorruptionIsDetected) {
  MemoryBudget dev(MemTier::kDevice, 64 << 20);
  constexpr std::size_t kBytes = (3 << 20) + 17;  // not a multiple of the block
  auto b = Buffer::allocate(MemTier::kDevice, kBytes, dev, {.what = "gpu test"});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_FALSE(b->emulated());
  EXPECT_EQ(dev.bytes_used(), kBytes);
  ASSERT_TRUE(fill_pattern(b->data(), kBytes, 7, ss_->compute()).ok());
  EXPECT_EQ(device_mismatches(b->data(), kBytes, 7), 0u);
  std::uint64_t want_other_seed = 0;  // exact, from the host reference
  for (std::size_t i = 0; i < kBytes; ++i)
    want_other_seed += pattern_byte(7, i) != pattern_byte(8, i);
  EXPECT_EQ(device_mismatches(b->data(), kBytes, 8), want_other_seed);
  // Corrupt one byte through the transfer engine: exactly one mismatch.
  const std::byte bad{static_cast<unsigned char>(pattern_byte(7, 12345) ^ 0xff)};
  ASSERT_TRUE(te_->h2d(b->data() + 12345, &bad, 1, ss_->compute()).ok());
  EXPECT_EQ(device_mismatches(b->data(), kBytes, 7), 1u);
}

TEST_F(MemGpu, PinnedRoundTripThroughTransferEngineWithEvents) {
  for (const PinnedMode mode : {PinnedMode::kHostAlloc, PinnedMode::kRegister}) {
    MemoryBudget dev(MemTier::kDevice), pin(MemTier::kPinnedHost);
    constexpr std::size_t kBytes = 8 << 20;
    auto h_src = Buffer::allocate(MemTier::kPinnedHost, kBytes, pin, {.pinned_mode = mode});
    auto h_dst = Buffer::allocate(MemTier::kPinnedHost, kBytes, pin, {.pinned_mode = mode});
    auto d = Buffer::allocate(MemTier::kDevice, kBytes, dev);
    ASSERT_TRUE(h_src.ok() && h_dst.ok() && d.ok());
    ASSERT_TRUE(fill_pattern(h_src->data(), kBytes, 99, Stream::host()).ok());
    std::memset(h_dst->data(), 0, kBytes);
    auto copied_in = Event::create(Device::kCuda, 0);
    auto verified = Event::create(Device::kCuda, 0);
    ASSERT_TRUE(copied_in.ok() && verified.ok());
    ASSERT_TRUE(te_->h2d(d->data(), h_src->data(), kBytes, ss_->h2d()).ok());
    ASSERT_TRUE(copied_in->record(ss_->h2d()).ok());
    ASSERT_TRUE(ss_->compute().wait(*copied_in).ok());
    EXPECT_EQ(device_mismatches(d->data(), kBytes, 99), 0u);  // on compute, after the event
    ASSERT_TRUE(ss_->order(ss_->compute(), ss_->d2h()).ok());
    ASSERT_TRUE(te_->d2h(h_dst->data(), d->data(), kBytes, ss_->d2h()).ok());
    ASSERT_TRUE(verified->record(ss_->d2h()).ok());
    ASSERT_TRUE(verified->synchronize().ok());
    EXPECT_TRUE(*verified->query());
    EXPECT_EQ(std::memcmp(h_src->data(), h_dst->data(), kBytes), 0);
  }
}

TEST_F(MemGpu, PinnedRingSlotsRecycleAfterCudaEvents) {
  MemoryBudget dev(MemTier::kDevice), pin(MemTier::kPinnedHost);
  auto ring =
      PinnedRing::create({.slots = 2, .slot_bytes = 1 << 20, .event_device = Device::kCuda}, pin);
  ASSERT_TRUE(ring.ok()) << ring.status().to_string();
  auto d = Buffer::allocate(MemTier::kDevice, 4 << 20, dev);
  ASSERT_TRUE(d.ok());
  for (std::uint32_t i = 0; i < 4; ++i) {
    auto s = ring->acquire();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    ASSERT_TRUE(fill_pattern(ring->data(*s), 1 << 20, i, Stream::host()).ok());
    ring->mark_ready(*s);
    ring->begin_use(*s);
    ASSERT_TRUE(te_->h2d(d->data() + (i << 20), ring->data(*s), 1 << 20, ss_->h2d()).ok());
    ASSERT_TRUE(ring->end_use(*s, ss_->h2d()).ok());
  }
  ASSERT_TRUE(ss_->order(ss_->h2d(), ss_->compute()).ok());
  for (std::uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(device_mismatches(d->data() + (i << 20), 1 << 20, i), 0u) << i;
  }
}

TEST_F(MemGpu, DeviceOutOfBudgetAndOutOfMemoryAreStatus) {
  MemoryBudget small(MemTier::kDevice, 1 << 20);
  ArenaPlan plan;
  plan.add("weights", 2 << 20);
  auto a = make_arena(plan, MemTier::kDevice, small);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(a.status().message().find("device budget exceeded"), std::string::npos);

  // A budget larger than the card: the driver refuses and we get a Status naming free memory.
  MemoryBudget huge(MemTier::kDevice);
  auto b = Buffer::allocate(MemTier::kDevice, std::size_t{1} << 50, huge, {.what = "1 PiB"});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted) << b.status().to_string();
  EXPECT_NE(b.status().message().find("1 PiB"), std::string::npos);
  EXPECT_NE(b.status().message().find("free"), std::string::npos);
  EXPECT_EQ(huge.bytes_used(), 0u);
  // The context stays usable after the failure.
  auto c = Buffer::allocate(MemTier::kDevice, 4096, huge);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
}

}  // namespace
}  // namespace ferry::mem
