// SPDX-License-Identifier: Apache-2.0
// VirtualRegion on the host tiers (the emulated device tier of CPU builds and pageable host), in
// both backings (granule by granule, and whole up front: the fallback where a GPU lacks VMM):
// commit/decommit rounding (out / in), the budget charged with committed granules only, an
// over-budget commit refused with nothing changed, data surviving other ranges' commits and
// decommits, a re-committed granule writable (and zero), bad ranges as Status, stable addresses;
// then per backing what is really held (mincore): decommitted pages given back, or every page
// held from reserve() on; the fallback's held_bytes(), its clear error when the whole range
// cannot be allocated, and FERRY_VMM=off.
#include "mem/virtual_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "mem/tier_alloc.h"
#include "scoped_env.h"

namespace ferry::mem {
namespace {

constexpr std::size_t kG = std::size_t{2} << 20;  // the host tiers' granule

struct RegionCase {
  MemTier tier;
  RegionBacking backing;
};

class VirtualRegionHost : public ::testing::TestWithParam<RegionCase> {
 protected:
  void SetUp() override {
    if (tier() == MemTier::kDevice && !detail::device_tier_emulated()) {
      GTEST_SKIP() << "CUDA build: device regions are covered by gpu_test (MemVirtualRegionGpu)";
    }
  }
  static MemTier tier() { return GetParam().tier; }
  static bool up_front() { return GetParam().backing == RegionBacking::kWholeUpFront; }
  // The case's options: `what` and `granularity` as given, the backing of the case.
  static VirtualRegionOptions opts(std::string_view what = "virtual region",
                                   std::size_t granularity = 0) {
    return {.granularity = granularity, .what = what, .backing = GetParam().backing};
  }
  static Result<VirtualRegion> reserve(std::size_t bytes, MemoryBudget& b,
                                       const VirtualRegionOptions& o) {
    return VirtualRegion::reserve(tier(), bytes, b, o);
  }
};

// Resident pages of [p, p + bytes) (mincore).
std::size_t resident_pages(const std::byte* p, std::size_t bytes) {
  const auto page = std::size_t(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> v(bytes / page);
  EXPECT_EQ(::mincore(const_cast<std::byte*>(p), bytes, v.data()), 0);
  std::size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST_P(VirtualRegionHost, GranularityIsTwoMiBAndReservationIsRoundedUp) {
  auto g = VirtualRegion::tier_granularity(tier());
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(*g, kG);
  MemoryBudget b(tier(), 64 << 20);
  auto r = reserve(5 * kG + 1, b, opts("test region"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->size(), 6 * kG);
  EXPECT_EQ(r->granularity(), kG);
  EXPECT_EQ(r->committed_bytes(), 0u);
  EXPECT_EQ(b.bytes_used(), 0u);  // a reservation is charged nothing, in either backing
  EXPECT_EQ(r->backed_up_front(), up_front());
  // What it really holds: nothing yet, or (the fallback) the whole reservation from now on.
  EXPECT_EQ(r->held_bytes(), up_front() ? 6 * kG : 0u);
}

TEST_P(VirtualRegionHost, CommitRoundsOutDecommitRoundsInAndTheBudgetFollows) {
  MemoryBudget b(tier(), 64 << 20);
  auto r = reserve(8 * kG, b, opts("test region"));
  ASSERT_TRUE(r.ok());
  // [1.5 G, 3.25 G) touches granules 1, 2, 3.
  ASSERT_TRUE(r->commit(kG + kG / 2, kG + 3 * kG / 4).ok());
  EXPECT_EQ(r->committed_bytes(), 3 * kG);
  EXPECT_EQ(r->held_bytes(), up_front() ? 8 * kG : 3 * kG);
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
  EXPECT_EQ(r->held_bytes(), up_front() ? 8 * kG : 0u);
  EXPECT_EQ(b.bytes_used(), 0u);
  EXPECT_EQ(r->peak_committed_bytes(), 3 * kG);
  EXPECT_EQ(b.bytes_peak(), 3 * kG);
}

TEST_P(VirtualRegionHost, OverBudgetCommitIsRefusedAndChangesNothing) {
  MemoryBudget b(tier(), 3 * kG);
  auto r = reserve(8 * kG, b, opts("kv test pool"));
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
  MemoryBudget b(tier(), 64 << 20);
  auto r = reserve(6 * kG, b, opts());
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
  EXPECT_EQ(moved.backed_up_front(), up_front());
  EXPECT_EQ(moved.held_bytes(), up_front() ? 6 * kG : kG);
  moved.reset();
  EXPECT_EQ(b.bytes_used(), 0u);
  EXPECT_EQ(moved.held_bytes(), 0u);
  EXPECT_FALSE(moved.backed_up_front());
}

TEST_P(VirtualRegionHost, RecommittedGranuleIsWritableAndZero) {
  MemoryBudget b(tier(), 64 << 20);
  auto r = reserve(2 * kG, b, opts());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->commit(0, 2 * kG).ok());
  std::memset(r->data(), 0xab, 2 * kG);
  ASSERT_TRUE(r->decommit(kG, kG).ok());
  ASSERT_TRUE(r->commit(kG, kG).ok());
  std::vector<std::byte> zeros(kG, std::byte{0});
  // Host tiers: fresh zero pages, or (up front) the granule zeroed when it was decommitted.
  EXPECT_EQ(std::memcmp(r->data() + kG, zeros.data(), kG), 0);
  EXPECT_EQ(r->data()[kG - 1], std::byte{0xab});
  std::memset(r->data() + kG, 0x11, kG);
  EXPECT_EQ(r->data()[2 * kG - 1], std::byte{0x11});
}

TEST_P(VirtualRegionHost, BadRangesAreStatusErrorsAndChangeNothing) {
  MemoryBudget b(tier(), 64 << 20);
  auto r = reserve(4 * kG, b, opts("bad ranges"));
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
  MemoryBudget b(tier(), 64 << 20);
  auto bad = reserve(kG, b, opts("odd granule", 3000));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  auto small = reserve(10000, b, opts("small granule", 4096));
  ASSERT_TRUE(small.ok()) << small.status().to_string();
  EXPECT_EQ(small->size(), 12288u);
  ASSERT_TRUE(small->commit(4097, 1).ok());
  EXPECT_EQ(small->committed_bytes(), 4096u);
  EXPECT_TRUE(small->is_committed(4096, 4096));
  EXPECT_FALSE(small->is_committed(0, 1));
  auto r = reserve(5 * kG, b, opts("large granule", 2 * kG));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->size(), 6 * kG);
  ASSERT_TRUE(r->commit(2 * kG + 1, 1).ok());
  EXPECT_EQ(r->committed_bytes(), 2 * kG);
  EXPECT_TRUE(r->is_committed(2 * kG, 2 * kG));
}

// Granule by granule: pages of a decommitted range are given back to the kernel: mincore reports
// them not resident (madvise(MADV_DONTNEED) on private anonymous memory frees them at once;
// nothing else maps them). Written pages of a committed range are resident, so the probe can
// tell the two apart. Whole up front: every page is resident from reserve() on, before any
// commit, and stays so through decommits (the fallback holds its whole range, as cudaMalloc does).
TEST_P(VirtualRegionHost, HeldPagesAreWhatTheBackingSays) {
  MemoryBudget b(tier(), 64 << 20);
  auto r = reserve(4 * kG, b, opts());
  ASSERT_TRUE(r.ok());
  const auto page = std::size_t(::sysconf(_SC_PAGESIZE));
  const std::size_t all = 4 * kG / page, one = kG / page;
  if (up_front()) {
    EXPECT_EQ(resident_pages(r->data(), 4 * kG), all);
  }
  ASSERT_TRUE(r->commit(0, 4 * kG).ok());
  std::memset(r->data(), 0x77, 4 * kG);
  EXPECT_EQ(resident_pages(r->data(), 4 * kG), all);
  ASSERT_TRUE(r->decommit(kG, 2 * kG).ok());
  EXPECT_EQ(resident_pages(r->data() + kG, 2 * kG), up_front() ? 2 * one : 0u);
  EXPECT_EQ(resident_pages(r->data(), kG), one);
  EXPECT_EQ(resident_pages(r->data() + 3 * kG, kG), one);
  EXPECT_EQ(r->held_bytes(), up_front() ? 4 * kG : 2 * kG);
}

INSTANTIATE_TEST_SUITE_P(
    All, VirtualRegionHost,
    ::testing::Values(RegionCase{MemTier::kPageableHost, RegionBacking::kAuto},
                      RegionCase{MemTier::kDevice, RegionBacking::kAuto},
                      RegionCase{MemTier::kPageableHost, RegionBacking::kWholeUpFront},
                      RegionCase{MemTier::kDevice, RegionBacking::kWholeUpFront}),
    [](const auto& param_info) {
      std::string s(to_string(param_info.param.tier));
      s += param_info.param.backing == RegionBacking::kAuto ? "_granules" : "_up_front";
      for (char& c : s) c = c == '-' ? '_' : c;
      return s;
    });

TEST(VirtualRegion, OtherTiersAreRefused) {
  MemoryBudget b(MemTier::kPinnedHost, 64 << 20);
  auto r = VirtualRegion::reserve(MemTier::kPinnedHost, kG, b);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  auto u = VirtualRegion::reserve(MemTier::kPinnedHost, kG, b,
                                  {.backing = RegionBacking::kWholeUpFront});
  EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument);
}

// The fallback's allocation of the whole range fails (here: past the test limit, as a device
// without that much free memory would): resource_exhausted naming the region, why it was backed
// up front and the bytes asked for; nothing is charged.
TEST(VirtualRegion, UpFrontReservationThatCannotBeAllocatedIsAClearError) {
  for (MemTier tier : {MemTier::kPageableHost, MemTier::kDevice}) {
    if (tier == MemTier::kDevice && !detail::device_tier_emulated()) continue;
    MemoryBudget b(tier, 64 << 20);
    auto r = VirtualRegion::reserve(tier, 5 * kG + 1, b,
                                    {.what = "expert slot pool",
                                     .backing = RegionBacking::kWholeUpFront,
                                     .up_front_limit_bytes = 4 * kG});
    ASSERT_FALSE(r.ok()) << to_string(tier);
    const Status& st = r.status();
    EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.to_string();
    EXPECT_NE(st.message().find("expert slot pool"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("whole-up-front backing asked for"), std::string::npos)
        << st.to_string();
    EXPECT_NE(st.message().find("allocated up front"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("need " + format_bytes(6 * kG)), std::string::npos)
        << st.to_string();
    EXPECT_EQ(b.bytes_used(), 0u);
    // At the limit it fits.
    auto ok = VirtualRegion::reserve(
        tier, 4 * kG, b, {.backing = RegionBacking::kWholeUpFront, .up_front_limit_bytes = 4 * kG});
    ASSERT_TRUE(ok.ok()) << ok.status().to_string();
    EXPECT_EQ(ok->held_bytes(), 4 * kG);
  }
}

// A real allocation failure (more address space than mmap can give): the same clear error, with
// the host's reason.
TEST(VirtualRegion, UpFrontReservationBeyondTheMachineIsAClearError) {
  MemoryBudget b(MemTier::kPageableHost);
  const std::size_t huge = std::size_t{1} << 49;  // 512 TiB: past any user address space
  auto r =
      VirtualRegion::reserve(MemTier::kPageableHost, huge, b,
                             {.what = "kv block pool", .backing = RegionBacking::kWholeUpFront});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
  EXPECT_NE(r.status().message().find("kv block pool"), std::string::npos);
  EXPECT_NE(r.status().message().find("mmap"), std::string::npos) << r.status().to_string();
}

// FERRY_VMM=off makes kAuto regions fall back (and an explicit backing ignores it the other way:
// there is no "force VMM"); unset or "auto", granules again.
TEST(VirtualRegion, FerryVmmOffForcesTheFallbackForAutoRegions) {
  for (MemTier tier : {MemTier::kPageableHost, MemTier::kDevice}) {
    if (tier == MemTier::kDevice && !detail::device_tier_emulated()) continue;
    MemoryBudget b(tier, 64 << 20);
    std::optional<VirtualRegion> off, on;
    {
      testing::ScopedEnv env("FERRY_VMM", "off");
      auto r = VirtualRegion::reserve(tier, 3 * kG, b, {.what = "env test"});
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      off = std::move(*r);
    }
    EXPECT_TRUE(off->backed_up_front());
    EXPECT_EQ(off->held_bytes(), 3 * kG);
    ASSERT_TRUE(off->commit(0, kG).ok());
    EXPECT_EQ(b.bytes_used(), kG);  // the budget still sees only what is committed
    {
      testing::ScopedEnv env("FERRY_VMM", "auto");
      auto r = VirtualRegion::reserve(tier, 3 * kG, b, {.what = "env test"});
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      on = std::move(*r);
    }
    EXPECT_FALSE(on->backed_up_front());
    EXPECT_EQ(on->held_bytes(), 0u);
  }
}

}  // namespace
}  // namespace ferry::mem
