// SPDX-License-Identifier: Apache-2.0
// MemoryBudget: a hard byte limit per tier with peak accounting. reserve() either charges the
// bytes or returns resource_exhausted naming the tier, the request and what is free; release()
// returns them. Thread-safe (atomic compare-exchange), so pager and executor threads may share one.
//
//   MemoryBudget vram(MemTier::kDevice, 24ull << 30);
//   FERRY_TRY(vram.reserve(bytes, "expert slot"));   // ... later: vram.release(bytes);
#pragma once

#include <atomic>
#include <cstddef>
#include <limits>
#include <string_view>

#include "core/status.h"
#include "mem/tier.h"

namespace ferry::mem {

class MemoryBudget {
 public:
  static constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

  explicit MemoryBudget(MemTier tier, std::size_t bytes_limit = kUnlimited)
      : tier_(tier), bytes_limit_(bytes_limit) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // what: names the requester in the error message ("kv block pool").
  Status reserve(std::size_t bytes, std::string_view what);
  void release(std::size_t bytes);

  MemTier tier() const { return tier_; }
  std::size_t bytes_limit() const { return bytes_limit_.load(); }
  std::size_t bytes_used() const { return bytes_used_.load(); }
  std::size_t bytes_peak() const { return bytes_peak_.load(); }
  std::size_t bytes_free() const;
  // Lowering below bytes_used() is refused (returns resource_exhausted) — shrink users first.
  Status set_limit(std::size_t bytes_limit);
  void reset_peak() { bytes_peak_.store(bytes_used_.load()); }

 private:
  MemTier tier_;
  std::atomic<std::size_t> bytes_limit_;
  std::atomic<std::size_t> bytes_used_{0};
  std::atomic<std::size_t> bytes_peak_{0};
};

// "12.5 MiB", "3.00 GiB", "512 B".
std::string format_bytes(std::size_t bytes);

}  // namespace ferry::mem
