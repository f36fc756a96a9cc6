// SPDX-License-Identifier: Apache-2.0
// VirtualRegion: granule bookkeeping over the vmm.h primitives; charge first, map, undo on failure.
#include "mem/virtual_region.h"

#include <utility>

#include "core/check.h"
#include "mem/tier_alloc.h"
#include "mem/vmm.h"

namespace ferry::mem {

namespace {
bool device_tier(MemTier t) { return t == MemTier::kDevice; }
}  // namespace

Result<std::size_t> VirtualRegion::tier_granularity(MemTier tier, int device) {
  if (tier == MemTier::kDevice) return detail::device_vmm_granularity(device);
  if (tier == MemTier::kPageableHost) return detail::kHostVmmGranularity;
  return invalid_argument("mem: no virtual regions in the {} tier", to_string(tier));
}

Result<VirtualRegion> VirtualRegion::reserve(MemTier tier, std::size_t bytes, MemoryBudget& budget,
                                             const VirtualRegionOptions& opts) {
  FERRY_CHECK(budget.tier() == tier, "mem: {} virtual region charged to a {} budget",
              to_string(tier), to_string(budget.tier()));
  FERRY_ASSIGN_OR_RETURN(const std::size_t tier_gran, tier_granularity(tier, opts.device));
  // Host memory (the emulated device tier included) can be committed page by page; a GPU only
  // in the driver's granules.
  const bool host_memory = tier != MemTier::kDevice || detail::device_tier_emulated();
  const std::size_t min_gran = host_memory ? detail::kPageBytes : tier_gran;
  std::size_t gran = tier_gran;
  if (opts.granularity != 0) {
    if (opts.granularity % min_gran != 0) {
      return invalid_argument("mem: granularity {} for {} is not a multiple of the {} tier's {}",
                              opts.granularity, opts.what, to_string(tier), min_gran);
    }
    gran = opts.granularity;
  }
  VirtualRegion r;
  r.tier_ = tier;
  r.device_ = opts.device;
  r.gran_ = gran;
  r.what_ = std::string(opts.what);
  if (bytes == 0) return r;
  if (bytes > std::size_t{1} << 50) {
    return invalid_argument("mem: {} of address space for {} is beyond any device",
                            format_bytes(bytes), opts.what);
  }
  const std::size_t size = detail::align_up(bytes, gran);
  FERRY_ASSIGN_OR_RETURN(
      r.base_, device_tier(tier) ? detail::device_vmm_reserve(size, gran, opts.device, opts.what)
                                 : detail::host_vmm_reserve(size, opts.what));
  r.size_ = size;
  r.budget_ = &budget;
  r.committed_.assign(size / gran, 0);
  r.handle_.assign(size / gran, 0);
  return r;
}

VirtualRegion::VirtualRegion(VirtualRegion&& other) noexcept { *this = std::move(other); }

VirtualRegion& VirtualRegion::operator=(VirtualRegion&& other) noexcept {
  if (this != &other) {
    reset();
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    gran_ = other.gran_;
    tier_ = other.tier_;
    device_ = other.device_;
    budget_ = std::exchange(other.budget_, nullptr);
    what_ = std::move(other.what_);
    committed_ = std::move(other.committed_);
    handle_ = std::move(other.handle_);
    committed_granules_ = std::exchange(other.committed_granules_, 0);
    peak_granules_ = std::exchange(other.peak_granules_, 0);
  }
  return *this;
}

VirtualRegion::~VirtualRegion() { reset(); }

void VirtualRegion::reset() {
  if (base_ == nullptr) return;
  for (std::size_t g = 0; g < committed_.size(); ++g) {
    if (committed_[g]) unmap_granule(g);
  }
  if (device_tier(tier_)) {
    detail::device_vmm_free(base_, size_, device_);
  } else {
    detail::host_vmm_free(base_, size_);
  }
  base_ = nullptr;
  size_ = 0;
  budget_ = nullptr;
  committed_.clear();
  handle_.clear();
}

Status VirtualRegion::check_range(std::size_t offset, std::size_t bytes) const {
  if (offset > size_ || bytes > size_ - offset) {
    return invalid_argument("mem: range [{}, +{}) outside the {}-byte region of {}", offset, bytes,
                            size_, what_);
  }
  return ok_status();
}

void VirtualRegion::unmap_granule(std::size_t g) {
  std::byte* at = base_ + g * gran_;
  if (device_tier(tier_)) {
    detail::device_vmm_unmap(at, gran_, handle_[g], device_);
  } else {
    detail::host_vmm_unmap(at, gran_);
  }
  committed_[g] = 0;
  handle_[g] = 0;
  --committed_granules_;
  budget_->release(gran_);
}

Status VirtualRegion::commit(std::size_t offset, std::size_t bytes) {
  FERRY_TRY(check_range(offset, bytes));
  if (bytes == 0) return ok_status();
  const std::size_t g0 = offset / gran_, g1 = (offset + bytes + gran_ - 1) / gran_;
  std::size_t fresh = 0;
  for (std::size_t g = g0; g < g1; ++g) fresh += committed_[g] == 0;
  if (fresh == 0) return ok_status();
  FERRY_TRY(budget_->reserve(fresh * gran_, what_));
  std::vector<std::size_t> mapped;
  mapped.reserve(fresh);
  for (std::size_t g = g0; g < g1; ++g) {
    if (committed_[g]) continue;
    std::byte* at = base_ + g * gran_;
    Status st;
    if (device_tier(tier_)) {
      Result<std::uint64_t> h = detail::device_vmm_map(at, gran_, device_, what_);
      if (h.ok()) {
        handle_[g] = *h;
      } else {
        st = std::move(h).take_status();
      }
    } else {
      st = detail::host_vmm_map(at, gran_, what_);
    }
    if (!st.ok()) {
      // Undo this call: unmap what it mapped, refund what it charged.
      for (std::size_t m : mapped) {
        if (device_tier(tier_)) {
          detail::device_vmm_unmap(base_ + m * gran_, gran_, handle_[m], device_);
        } else {
          detail::host_vmm_unmap(base_ + m * gran_, gran_);
        }
        committed_[m] = 0;
        handle_[m] = 0;
      }
      committed_granules_ -= mapped.size();
      budget_->release(fresh * gran_);
      return st;
    }
    committed_[g] = 1;
    ++committed_granules_;
    mapped.push_back(g);
  }
  if (committed_granules_ > peak_granules_) peak_granules_ = committed_granules_;
  return ok_status();
}

Status VirtualRegion::decommit(std::size_t offset, std::size_t bytes) {
  FERRY_TRY(check_range(offset, bytes));
  const std::size_t g0 = (offset + gran_ - 1) / gran_, g1 = (offset + bytes) / gran_;
  for (std::size_t g = g0; g < g1; ++g) {
    if (committed_[g]) unmap_granule(g);
  }
  return ok_status();
}

bool VirtualRegion::is_committed(std::size_t offset, std::size_t bytes) const {
  if (!check_range(offset, bytes).ok()) return false;
  if (bytes == 0) return true;
  const std::size_t g0 = offset / gran_, g1 = (offset + bytes + gran_ - 1) / gran_;
  for (std::size_t g = g0; g < g1; ++g) {
    if (!committed_[g]) return false;
  }
  return true;
}

}  // namespace ferry::mem
