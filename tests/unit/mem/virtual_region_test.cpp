// SPDX-License-Identifier: Apache-2.0
// VirtualRegion on the host tiers (the emulated device tier of CPU builds and pageable host):
// commit/decommit rounding (out / in), the budget charged with committed granules only, an
// over-budget commit refused with nothing changed, data surviving other ranges' commits and
// decommits, a re-committed granule writable (and zero), bad ranges as Status, stable addresses,
// and pages really given back (mincore).
#include "mem/virtual_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "mem/tier_alloc.h"

namespace ferry::mem {
namespace {

constexpr std::size_t kG = std::size_t{2} << 20;  // the host tiers' granule

class VirtualRegionHost : public ::testing::TestWithParam<MemTier> {
 protected:
  void SetUp() override {
    if (GetParam() == MemTier::kDevice && !detail::device_tier_emulated()) {
      GTEST_SKIP() << "CUDA build: device regions are covered by gpu_test (MemVirtualRegionGpu)";
    }
  }
};

TEST_P(VirtualRegionHost, GranularityIsTwoMiBAndReservationIsRoundedUp) {
  auto g = VirtualRegion::tier_granularity(GetParam());
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(*g, kG);
  MemoryBudget b(GetParam(), 64 << 20);
  auto r = VirtualRegion::reserve(GetParam(), 5 * kG + 1, b, {.what = "test region"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->size(), 6 * kG);
  EXPECT_EQ(r->granularity(), kG);
  EXPECT_EQ(r->committed_bytes(), 0u);
  EXPECT_EQ(b.bytes_used(), 0u);  // a reservation costs nothing
}

TEST_P(VirtualRegionHost, CommitRoundsOutDecommitRoundsInAndTheBudgetFollows) {
  MemoryBudget b(GetParam(), 64 << 20);
  auto r = VirtualRegion::reserve(GetParam(), 8 * kG, b, {.what = "test region"});
  ASSERT_TRUE(r.ok());
  // [1.5 G, 3.25 G) touches granules 1, 2, 3.
  ASSERT_TRUE(r->commit(kG + kG / 2, kG + 3 * kG / 4).ok());
  EXPECT_EQ(r->committed_bytes(), 3 * kG);
  EXPECT_EQ(b.bytes_used(), 3 * kG);
  EXPECT_TRUE(r->is_committed(kG, 3 * kG));
  EXPECT_FALSE(r->is_committed(0, 1));
  EXPECT_FALSE(r->is_committed(4 * kG, 1));
  // Committing again (or a sub-range) charges nothing more.
  ASSERT_TRUE(r->commit(2 * kG + 7, 100).ok());
  EXPECT_EQ(b.bytes_used(), 3 * kG);
  // [1.5 G, 3.5 G) holds only granule 2 wholly: 1 and 3 stay.
  ASSERT_TRUE(r->decommit(kG + kG / 2, 2 * kG).ok());
  EXPECT_EQ(r->committed_bytes(), 2 * kG);
  EXPECT_EQ(b.bytes_used(), 2 * kG);
  EXPECT_TRUE(r->is_committed(kG, kG));
  EXPECT_FALSE(r->is_committed(2 * kG, 1));
  EXPECT_TRUE(r->is_committed(3 * kG, kG));
  // A range inside one granule releases nothing.
  ASSERT_TRUE(r->decommit(kG + 1, kG - 2).ok());
  EXPECT_EQ(r->committed_bytes(), 2 * kG);
  ASSERT_TRUE(r->decommit(0, r->size()).ok());
  EXPECT_EQ(r->committed_bytes(), 0u);
  EXPECT_EQ(b.bytes_used(), 0u);
  EXPECT_EQ(r->peak_committed_bytes(), 3 * kG);
  EXPECT_EQ(b.bytes_peak(), 3 * kG);
}

TEST_P(VirtualRegionHost, OverBudgetCommitIsRefusedAndChangesNothing) {
  MemoryBudget b(GetParam(), 3 * kG);
  auto r = VirtualRegion::reserve(GetParam(), 8 * kG, b, {.what = "kv test pool"});
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->commit(0, 2 * kG).ok());
  std::memset(r->data(), 0x5a, 2 * kG);
  const Status st = r->commit(kG, 3 * kG);  // granules 1..3: two fresh, one over the budget
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("kv test pool"), std::string::npos) << st.to_string();
  EXPECT_EQ(r->committed_bytes(), 2 * kG);
  EXPECT_EQ(b.bytes_used(), 2 * kG);
  EXPECT_FALSE(r->is_committed(2 * kG, 1));
  EXPECT_EQ(r->data()[2 * kG - 1], std::byte{0x5a});
  // What fits still commits.
  ASSERT_TRUE(r->commit(2 * kG, 1).ok());
  EXPECT_EQ(b.bytes_used(), 3 * kG);
}

TEST_P(VirtualRegionHost, DataSurvivesOtherRangesAndAddressesAreStable) {
  MemoryBudget b(GetParam(), 64 << 20);
  auto r = VirtualRegion::reserve(GetParam(), 6 * kG, b);
  ASSERT_TRUE(r.ok());
  std::byte* const base = r->data();
  ASSERT_TRUE(r->commit(2 * kG, kG).ok());
  for (std::size_t i = 0; i < kG; i += 4096) base[2 * kG + i] = std::byte(i / 4096 + 1);
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(r->commit(0, 2 * kG).ok());
    ASSERT_TRUE(r->commit(3 * kG, 3 * kG).ok());
    std::memset(base, 0xee, 2 * kG);
    std::memset(base + 3 * kG, 0xdd, 3 * kG);
    ASSERT_TRUE(r->decommit(0, 2 * kG).ok());
    ASSERT_TRUE(r->decommit(3 * kG, 3 * kG).ok());
  }
  EXPECT_EQ(r->data(), base);
  for (std::size_t i = 0; i < kG; i += 4096) {
    ASSERT_EQ(base[2 * kG + i], std::byte(i / 4096 + 1)) << i;
  }
  // A move keeps the addresses and the charge.
  VirtualRegion moved = std::move(r).value();
  EXPECT_EQ(moved.data(), base);
  EXPECT_EQ(b.bytes_used(), kG);
  moved.reset();
  EXPECT_EQ(b.bytes_used(), 0u);
}

TEST_P(VirtualRegionHost, RecommittedGranuleIsWritableAndZero) {
  MemoryBudget b(GetParam(), 64 << 20);
  auto r = VirtualRegion::reserve(GetParam(), 2 * kG, b);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->commit(0, 2 * kG).ok());
  std::memset(r->data(), 0xab, 2 * kG);
  ASSERT_TRUE(r->decommit(kG, kG).ok());
  ASSERT_TRUE(r->commit(kG, kG).ok());
  std::vector<std::byte> zeros(kG, std::byte{0});
  EXPECT_EQ(std::memcmp(r->data() + kG, zeros.data(), kG), 0);  // host tiers: fresh zero pages
  EXPECT_EQ(r->data()[kG - 1], std::byte{0xab});
  std::memset(r->data() + kG, 0x11, kG);
  EXPECT_EQ(r->data()[2 * kG - 1], std::byte{0x11});
}

TEST_P(VirtualRegionHost, BadRangesAreStatusErrorsAndChangeNothing) {
  MemoryBudget b(GetParam(), 64 << 20);
  auto r = VirtualRegion::reserve(GetParam(), 4 * kG, b, {.what = "bad ranges"});
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->commit(0, kG).ok());
  const std::size_t huge = ~std::size_t{0};
  for (const auto& [off, n] : std::vector<std::pair<std::size_t, std::size_t>>{
           {4 * kG, 1}, {0, 4 * kG + 1}, {3 * kG, 2 * kG}, {huge, 2}, {1, huge}}) {
    const Status c = r->commit(off, n);
    EXPECT_EQ(c.code(), StatusCode::kInvalidArgument) << off << " +" << n << ": " << c.to_string();
    const Status d = r->decommit(off, n);
    EXPECT_EQ(d.code(), StatusCode::kInvalidArgument) << off << " +" << n;
    EXPECT_FALSE(r->is_committed(off, n));
  }
  EXPECT_EQ(r->committed_bytes(), kG);
  EXPECT_EQ(b.bytes_used(), kG);
  // Empty ranges at the end are fine.
  EXPECT_TRUE(r->commit(4 * kG, 0).ok());
  EXPECT_TRUE(r->decommit(4 * kG, 0).ok());
}

TEST_P(VirtualRegionHost, AskedGranularityMustBeAMultipleOfThePage) {
  MemoryBudget b(GetParam(), 64 << 20);
  auto bad = VirtualRegion::reserve(GetParam(), kG, b, {.granularity = 3000});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  auto small = VirtualRegion::reserve(GetParam(), 10000, b, {.granularity = 4096});
  ASSERT_TRUE(small.ok()) << small.status().to_string();
  EXPECT_EQ(small->size(), 12288u);
  ASSERT_TRUE(small->commit(4097, 1).ok());
  EXPECT_EQ(small->committed_bytes(), 4096u);
  EXPECT_TRUE(small->is_committed(4096, 4096));
  EXPECT_FALSE(small->is_committed(0, 1));
  auto r = VirtualRegion::reserve(GetParam(), 5 * kG, b, {.granularity = 2 * kG});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->size(), 6 * kG);
  ASSERT_TRUE(r->commit(2 * kG + 1, 1).ok());
  EXPECT_EQ(r->committed_bytes(), 2 * kG);
  EXPECT_TRUE(r->is_committed(2 * kG, 2 * kG));
}

// Pages of a decommitted range are given back to the kernel: mincore reports them not resident
// (madvise(MADV_DONTNEED) on private anonymous memory frees them at once; nothing else maps
// them). Written pages of a committed range are resident, so the probe can tell the two apart.
TEST_P(VirtualRegionHost, DecommittedPagesAreReallyReleased) {
  MemoryBudget b(GetParam(), 64 << 20);
  auto r = VirtualRegion::reserve(GetParam(), 4 * kG, b);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->commit(0, 4 * kG).ok());
  std::memset(r->data(), 0x77, 4 * kG);
  const long page = ::sysconf(_SC_PAGESIZE);
  const auto resident_pages = [&](std::size_t off, std::size_t bytes) {
    std::vector<unsigned char> v(bytes / std::size_t(page));
    EXPECT_EQ(::mincore(r->data() + off, bytes, v.data()), 0);
    std::size_t n = 0;
    for (unsigned char c : v) n += c & 1;
    return n;
  };
  EXPECT_EQ(resident_pages(0, 4 * kG), 4 * kG / std::size_t(page));
  ASSERT_TRUE(r->decommit(kG, 2 * kG).ok());
  EXPECT_EQ(resident_pages(kG, 2 * kG), 0u);
  EXPECT_EQ(resident_pages(0, kG), kG / std::size_t(page));
  EXPECT_EQ(resident_pages(3 * kG, kG), kG / std::size_t(page));
}

INSTANTIATE_TEST_SUITE_P(All, VirtualRegionHost,
                         ::testing::Values(MemTier::kPageableHost, MemTier::kDevice),
                         [](const auto& param_info) {
                           std::string s(to_string(param_info.param));
                           for (char& c : s) c = c == '-' ? '_' : c;
                           return s;
                         });

TEST(VirtualRegion, OtherTiersAreRefused) {
  MemoryBudget b(MemTier::kPinnedHost, 64 << 20);
  auto r = VirtualRegion::reserve(MemTier::kPinnedHost, kG, b);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::mem
