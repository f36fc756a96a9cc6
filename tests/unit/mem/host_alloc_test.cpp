// SPDX-License-Identifier: Apache-2.0
// The host primitives behind the pinned tier's register mode (host_alloc.cpp): prefault_pages
// makes every page of a fresh mapping resident (mincore) and leaves it zero, for sizes that are
// not a multiple of a page or of the 2 MiB pieces it touches in parallel; and the
// FERRY_PINNED_MODE spellings.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cstdlib>

#include <cstddef>
#include <vector>

#include "mem/tier_alloc.h"

namespace ferry::mem {
namespace {

// Pages of [p, p + bytes) resident in memory (mincore).
std::size_t resident_pages(std::byte* p, std::size_t bytes) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t n = (bytes + page - 1) / page;
  std::vector<unsigned char> v(n);
  EXPECT_EQ(::mincore(p, bytes, v.data()), 0);
  std::size_t r = 0;
  for (unsigned char c : v) r += c & 1u;
  return r;
}

TEST(HostAlloc, PrefaultMakesEveryPagePresentAndZero) {
  for (std::size_t bytes :
       {std::size_t{1}, std::size_t{4095}, std::size_t{3} << 20, (std::size_t{5} << 20) + 12345}) {
    auto p = detail::map_pages(bytes, "pinned-host", "test");
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    const std::size_t mapped = detail::align_up(bytes, detail::kPageBytes);
    EXPECT_EQ(resident_pages(*p, mapped), 0u) << bytes;  // a fresh anonymous mapping
    detail::prefault_pages(*p, bytes);
    EXPECT_EQ(resident_pages(*p, mapped), mapped / detail::kPageBytes) << bytes;
    for (std::size_t o = 0; o < mapped; ++o) {
      ASSERT_EQ((*p)[o], std::byte{0}) << bytes << " at " << o;
    }
    detail::unmap_pages(*p, bytes);
  }
}

TEST(HostAlloc, PinnedModeSpellings) {
  EXPECT_EQ(parse_pinned_mode("hostalloc"), PinnedMode::kHostAlloc);
  EXPECT_EQ(parse_pinned_mode("register"), PinnedMode::kRegister);
  EXPECT_FALSE(parse_pinned_mode("Register").has_value());
  EXPECT_FALSE(parse_pinned_mode("").has_value());
}

// Unset, the train arena registers pages and may fall back; set, the choice is the user's.
TEST(HostAlloc, LargeArenaPinningDefaultIsRegisterWithFallback) {
  const char* e = std::getenv("FERRY_PINNED_MODE");
  const LargeArenaPinning pin = large_arena_pinned_mode();
  if (e == nullptr) {
    EXPECT_EQ(pin.mode, PinnedMode::kRegister);
    EXPECT_FALSE(pin.explicit_choice);
  } else {
    const std::optional<PinnedMode> m = parse_pinned_mode(e);
    EXPECT_EQ(pin.explicit_choice, m.has_value());
    EXPECT_EQ(pin.mode, m.value_or(PinnedMode::kRegister));
  }
}

}  // namespace
}  // namespace ferry::mem
