// SPDX-License-Identifier: Apache-2.0
#include "mem/budget.h"

#include <fmt/format.h>

#include "core/check.h"
#include "mem/tier_alloc.h"

namespace ferry::mem {

std::string_view to_string(MemTier t) {
  switch (t) {
    case MemTier::kDevice:
      return "device";
    case MemTier::kPinnedHost:
      return "pinned-host";
    case MemTier::kPageableHost:
      return "pageable-host";
    case MemTier::kMappedFile:
      return "mapped-file";
    case MemTier::kNvme:
      return "nvme";
  }
  return "?";
}

bool device_tier_is_host_memory() { return detail::device_tier_emulated(); }

std::string format_bytes(std::size_t b) {
  const double v = static_cast<double>(b);
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", v / double(1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MiB", v / double(1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", v / 1024.0);
  return fmt::format("{} B", b);
}

std::size_t MemoryBudget::bytes_free() const {
  const std::size_t lim = bytes_limit_.load(), used = bytes_used_.load();
  return used >= lim ? 0 : lim - used;
}

Status MemoryBudget::reserve(std::size_t bytes, std::string_view what) {
  std::size_t used = bytes_used_.load();
  for (;;) {
    const std::size_t lim = bytes_limit_.load();
    if (bytes > lim || used > lim - bytes) {
      return resource_exhausted("mem: {} budget exceeded by {}: need {}, free {} of {} limit",
                                to_string(tier_), what, format_bytes(bytes),
                                format_bytes(used >= lim ? 0 : lim - used),
                                lim == kUnlimited ? std::string("unlimited") : format_bytes(lim));
    }
    if (bytes_used_.compare_exchange_weak(used, used + bytes)) break;
  }
  const std::size_t now = used + bytes;
  std::size_t peak = bytes_peak_.load();
  while (now > peak && !bytes_peak_.compare_exchange_weak(peak, now)) {
  }
  return {};
}

void MemoryBudget::release(std::size_t bytes) {
  const std::size_t prev = bytes_used_.fetch_sub(bytes);
  FERRY_CHECK(prev >= bytes, "mem: {} budget released {} but only {} in use", to_string(tier_),
              bytes, prev);
}

Status MemoryBudget::set_limit(std::size_t bytes_limit) {
  if (bytes_limit < bytes_used_.load()) {
    return resource_exhausted("mem: cannot set {} limit to {}: {} in use", to_string(tier_),
                              format_bytes(bytes_limit), format_bytes(bytes_used_.load()));
  }
  bytes_limit_.store(bytes_limit);
  return {};
}

}  // namespace ferry::mem
