// SPDX-License-Identifier: Apache-2.0
// Buffer: charge the budget, allocate in the tier, refund on failure; free + release on reset.
#include "mem/buffer.h"

#include <utility>

#include "core/check.h"

namespace ferry::mem {

Result<Buffer> Buffer::allocate(MemTier tier, std::size_t bytes, MemoryBudget& budget,
                                const BufferOptions& opts) {
  FERRY_CHECK(budget.tier() == tier, "mem: {} buffer charged to a {} budget", to_string(tier),
              to_string(budget.tier()));
  if (tier == MemTier::kMappedFile || tier == MemTier::kNvme) {
    return invalid_argument("mem: {} is not a Buffer tier (requested by {})", to_string(tier),
                            opts.what);
  }
  Buffer b;
  b.tier_ = tier;
  b.device_ = opts.device;
  b.pinned_mode_ = opts.pinned_mode;
  if (bytes == 0) return b;

  FERRY_TRY(budget.reserve(bytes, opts.what));
  Result<std::byte*> p = [&]() -> Result<std::byte*> {
    switch (tier) {
      case MemTier::kDevice:
        return detail::device_alloc(bytes, opts.device, opts.what);
      case MemTier::kPinnedHost:
        return detail::pinned_alloc(bytes, opts.pinned_mode, opts.write_combined, opts.what);
      case MemTier::kPageableHost:
        return detail::pageable_alloc(bytes, opts.what);
      case MemTier::kMappedFile:
      case MemTier::kNvme:
        break;
    }
    return internal_error("mem: unreachable tier {}", static_cast<int>(tier));
  }();
  if (!p.ok()) {
    budget.release(bytes);
    return std::move(p).take_status();
  }
  b.data_ = *p;
  b.size_ = bytes;
  b.budget_ = &budget;
  return b;
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      tier_(other.tier_),
      device_(other.device_),
      pinned_mode_(other.pinned_mode_),
      budget_(std::exchange(other.budget_, nullptr)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    tier_ = other.tier_;
    device_ = other.device_;
    pinned_mode_ = other.pinned_mode_;
    budget_ = std::exchange(other.budget_, nullptr);
  }
  return *this;
}

Buffer::~Buffer() { reset(); }

void Buffer::reset() {
  if (data_ == nullptr) return;
  switch (tier_) {
    case MemTier::kDevice:
      detail::device_free(data_, size_, device_);
      break;
    case MemTier::kPinnedHost:
      detail::pinned_free(data_, size_, pinned_mode_);
      break;
    case MemTier::kPageableHost:
      detail::pageable_free(data_);
      break;
    case MemTier::kMappedFile:
    case MemTier::kNvme:
      FERRY_CHECK(false, "mem: buffer in non-buffer tier {}", to_string(tier_));
  }
  budget_->release(size_);
  data_ = nullptr;
  size_ = 0;
  budget_ = nullptr;
}

}  // namespace ferry::mem
