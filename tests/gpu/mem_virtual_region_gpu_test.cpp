// SPDX-License-Identifier: Apache-2.0
// GPU: mem::VirtualRegion on the device tier (the CUDA virtual memory management API):
//   - the driver's granularity; commit / write (pattern kernel) / read back; data in committed
//     granules survives decommits and commits of others; a re-committed granule is writable;
//     committing really takes device memory and decommitting really gives it back (cudaMemGetInfo
//     moves by the granules, within the driver's own rounding); addresses never move;
//   - an over-budget commit is resource_exhausted naming the region and changes nothing;
//   - the whole-up-front backing (the fallback where a GPU lacks VMM, forced here): cudaMemGetInfo
//     moves by the whole reservation at reserve() and not at commit/decommit, held_bytes() is the
//     reservation, the budget still sees only commits (refusals included), data is kept, and a
//     reservation larger than the card is a clear resource_exhausted naming the region.
// Skips without a CUDA device (and the granule tests on a device without VMM, saying so).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>

#include <gtest/gtest.h>

#include "mem/buffer.h"
#include "mem/device_info.h"
#include "mem/device_pattern.h"
#include "mem/stream_set.h"
#include "mem/transfer_engine.h"
#include "mem/virtual_region.h"
#include "tests/gpu/mem_gpu_fixture.h"

namespace ferry::mem {
namespace {

class MemVirtualRegionGpu : public testing::MemGpuFixture {
 protected:
  static std::size_t device_free() {
    std::size_t free_b = 0, total_b = 0;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    return free_b;
  }
  static std::size_t device_total() {
    std::size_t free_b = 0, total_b = 0;
    EXPECT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
    return total_b;
  }
};

// The granule tests' skip where kAuto fell back (the device or driver lacks VMM, or FERRY_VMM=off).
constexpr const char* kNoVmm =
    "device 0 has no CUDA virtual memory management (or FERRY_VMM=off): the region fell back to "
    "the whole-up-front backing, covered by WholeUpFront* below";

TEST_F(MemVirtualRegionGpu, CommitWriteReadDecommitAndMemoryReallyMoves) {
  auto g = VirtualRegion::tier_granularity(MemTier::kDevice, 0);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const std::size_t G = *g;
  EXPECT_GT(G, 0u);
  EXPECT_EQ(G % 4096, 0u);
  std::cout << "[mem_gpu] device allocation granularity " << G << " bytes\n";
  // 256 granules (512 MiB at 2 MiB): large enough that cudaMemGetInfo's steps show.
  constexpr std::size_t kN = 256;
  MemoryBudget vram(MemTier::kDevice, kN * G);
  auto r = VirtualRegion::reserve(MemTier::kDevice, kN * G, vram, {.what = "gpu test region"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  if (r->backed_up_front()) GTEST_SKIP() << kNoVmm;
  EXPECT_EQ(r->held_bytes(), 0u);
  std::byte* const base = r->data();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(base) % G, 0u);
  const std::size_t free0 = device_free();
  ASSERT_TRUE(r->commit(0, kN * G).ok());
  EXPECT_EQ(vram.bytes_used(), kN * G);
  const std::size_t free1 = device_free();
  const std::size_t slack = 16 * G;  // the driver's own bookkeeping and rounding
  EXPECT_GE(free0 - free1 + slack, kN * G) << "committing took less memory than it backs";
  EXPECT_LE(free0 - free1, kN * G + slack);
  ASSERT_TRUE(fill_pattern(base, kN * G, 7, ss_->compute()).ok());
  EXPECT_EQ(device_mismatches(base, kN * G, 7), 0u);
  // The upper half goes back: memory is really returned, the lower half keeps its bytes.
  ASSERT_TRUE(r->decommit(kN / 2 * G, kN / 2 * G).ok());
  EXPECT_EQ(vram.bytes_used(), kN / 2 * G);
  const std::size_t free2 = device_free();
  EXPECT_GE(free2 - free1 + slack, kN / 2 * G) << "decommitting gave back less than it released";
  // Half the lower half's granules cycle through decommit / commit; the rest keeps its bytes.
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(r->decommit(kN / 4 * G, kN / 4 * G).ok());
    ASSERT_TRUE(r->commit(kN / 4 * G, kN / 4 * G).ok());
  }
  EXPECT_EQ(device_mismatches(base, kN / 4 * G, 7), 0u);
  // Re-committed granules are writable (their contents are undefined until written).
  ASSERT_TRUE(fill_pattern(base + kN / 4 * G, kN / 4 * G, 9, ss_->compute()).ok());
  EXPECT_EQ(device_mismatches(base + kN / 4 * G, kN / 4 * G, 9), 0u);
  ASSERT_TRUE(r->commit(kN / 2 * G, G + 1).ok());  // rounds out: two granules
  EXPECT_EQ(vram.bytes_used(), (kN / 2 + 2) * G);
  EXPECT_EQ(r->data(), base);
  EXPECT_EQ(r->peak_committed_bytes(), kN * G);
  r->reset();
  EXPECT_EQ(vram.bytes_used(), 0u);
  const std::size_t free3 = device_free();
  EXPECT_GE(free3 + slack, free0) << "the region's memory did not all come back";
}

TEST_F(MemVirtualRegionGpu, OverBudgetCommitIsRefusedAndChangesNothing) {
  auto g = VirtualRegion::tier_granularity(MemTier::kDevice, 0);
  ASSERT_TRUE(g.ok());
  const std::size_t G = *g;
  MemoryBudget vram(MemTier::kDevice, 3 * G);
  auto r = VirtualRegion::reserve(MemTier::kDevice, 8 * G, vram, {.what = "kv gpu test"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  if (r->backed_up_front()) GTEST_SKIP() << kNoVmm;
  ASSERT_TRUE(r->commit(0, 2 * G).ok());
  ASSERT_TRUE(fill_pattern(r->data(), 2 * G, 3, ss_->compute()).ok());
  const Status st = r->commit(G, 3 * G);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("kv gpu test"), std::string::npos) << st.to_string();
  EXPECT_EQ(vram.bytes_used(), 2 * G);
  EXPECT_FALSE(r->is_committed(2 * G, 1));
  EXPECT_EQ(device_mismatches(r->data(), 2 * G, 3), 0u);
  EXPECT_EQ(r->commit(8 * G, 1).code(), StatusCode::kInvalidArgument);
}

// The fallback forced on a card that has VMM: the memory is taken once, by reserve(), for the
// whole range, and commits and decommits move only the budget, never the device's free memory.
TEST_F(MemVirtualRegionGpu, WholeUpFrontTakesItsMemoryAtReserveNotAtCommit) {
  auto g = VirtualRegion::tier_granularity(MemTier::kDevice, 0);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const std::size_t G = *g;
  constexpr std::size_t kN = 256;    // 512 MiB at 2 MiB: cudaMemGetInfo's steps show
  const std::size_t slack = 16 * G;  // the driver's own bookkeeping and rounding
  MemoryBudget vram(MemTier::kDevice, kN / 2 * G);
  const auto used_since = [](std::size_t before, std::size_t now) {
    return std::ptrdiff_t(before) - std::ptrdiff_t(now);
  };
  const std::size_t free0 = device_free();
  auto r = VirtualRegion::reserve(
      MemTier::kDevice, kN * G, vram,
      {.what = "gpu up-front region", .backing = RegionBacking::kWholeUpFront});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->backed_up_front());
  EXPECT_EQ(r->held_bytes(), kN * G);
  EXPECT_EQ(r->committed_bytes(), 0u);
  EXPECT_EQ(vram.bytes_used(), 0u);
  const std::size_t free1 = device_free();
  const std::ptrdiff_t taken = used_since(free0, free1);
  std::cout << "[mem_gpu] whole-up-front reserve of " << kN * G << " bytes took " << taken
            << " bytes of device memory\n";
  EXPECT_GE(taken + std::ptrdiff_t(slack), std::ptrdiff_t(kN * G)) << "reserve took too little";
  EXPECT_LE(taken, std::ptrdiff_t(kN * G + slack)) << "reserve took too much";
  // Commits charge the budget (with its refusal) and take no device memory.
  std::byte* const base = r->data();
  ASSERT_TRUE(r->commit(0, kN / 2 * G).ok());
  EXPECT_EQ(vram.bytes_used(), kN / 2 * G);
  const Status over = r->commit(kN / 4 * G, kN / 2 * G);  // past the budget: refused
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("gpu up-front region"), std::string::npos) << over.to_string();
  EXPECT_EQ(vram.bytes_used(), kN / 2 * G);
  EXPECT_FALSE(r->is_committed(kN / 2 * G, 1));
  const std::size_t free2 = device_free();
  EXPECT_LE(std::abs(used_since(free1, free2)), std::ptrdiff_t(slack)) << "commit moved memory";
  ASSERT_TRUE(fill_pattern(base, kN / 2 * G, 5, ss_->compute()).ok());
  EXPECT_EQ(device_mismatches(base, kN / 2 * G, 5), 0u);
  // Decommitting the upper quarter gives the charge back, not the memory; the rest keeps its
  // bytes, and the decommitted granules can be committed and written again.
  ASSERT_TRUE(r->decommit(kN / 4 * G, kN / 4 * G).ok());
  EXPECT_EQ(vram.bytes_used(), kN / 4 * G);
  EXPECT_EQ(r->held_bytes(), kN * G);
  const std::size_t free3 = device_free();
  EXPECT_LE(std::abs(used_since(free2, free3)), std::ptrdiff_t(slack)) << "decommit moved memory";
  EXPECT_EQ(device_mismatches(base, kN / 4 * G, 5), 0u);
  ASSERT_TRUE(r->commit(kN / 4 * G + 1, kN / 4 * G - 2).ok());  // rounds out: the whole quarter
  EXPECT_EQ(vram.bytes_used(), kN / 2 * G);
  ASSERT_TRUE(fill_pattern(base + kN / 4 * G, kN / 4 * G, 6, ss_->compute()).ok());
  EXPECT_EQ(device_mismatches(base + kN / 4 * G, kN / 4 * G, 6), 0u);
  EXPECT_EQ(r->data(), base);
  r->reset();
  EXPECT_EQ(vram.bytes_used(), 0u);
  const std::size_t free4 = device_free();
  EXPECT_LE(std::abs(used_since(free0, free4)), std::ptrdiff_t(slack))
      << "the region's memory did not all come back";
}

// The fallback cannot allocate the whole range (more than the card has): resource_exhausted
// naming the region, why it was backed up front, the bytes needed and the driver's free bytes.
TEST_F(MemVirtualRegionGpu, WholeUpFrontBeyondTheCardIsAClearError) {
  const std::size_t too_much = device_total() + (std::size_t{1} << 30);
  MemoryBudget vram(MemTier::kDevice);
  auto r = VirtualRegion::reserve(
      MemTier::kDevice, too_much, vram,
      {.what = "kv gpu up-front pool", .backing = RegionBacking::kWholeUpFront});
  ASSERT_FALSE(r.ok());
  const Status& st = r.status();
  std::cout << "[mem_gpu] " << st.to_string() << "\n";
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
  EXPECT_NE(st.message().find("kv gpu up-front pool"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("allocated up front"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("need "), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("free "), std::string::npos) << st.to_string();
  EXPECT_EQ(vram.bytes_used(), 0u);
  // The device is still usable afterwards.
  auto ok = VirtualRegion::reserve(MemTier::kDevice, 4 << 20, vram,
                                   {.backing = RegionBacking::kWholeUpFront});
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
}

}  // namespace
}  // namespace ferry::mem
