// SPDX-License-Identifier: Apache-2.0
// VirtualRegion: granule bookkeeping over the vmm.h primitives; charge first, map, undo on failure.
// The whole-up-front backing keeps the same bookkeeping and charges and skips the mapping: one
// code path for the budget, so the pools above behave identically in both backings.
#include "mem/virtual_region.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/check.h"
#include "core/log.h"
#include "mem/tier_alloc.h"
#include "mem/vmm.h"

namespace ferry::mem {

namespace {
bool device_tier(MemTier t) { return t == MemTier::kDevice; }
// Whether the tier's bytes are host memory (the emulated device tier too).
bool host_memory_tier(MemTier t) { return !device_tier(t) || detail::device_tier_emulated(); }

// FERRY_VMM=off: kAuto regions are backed whole up front, e.g. to run the fallback on a card that
// has VMM (or in CI). Read at every reserve (a few per engine), so a test can set it.
bool vmm_off_by_env() {
  const char* e = std::getenv("FERRY_VMM");
  if (e == nullptr || *e == '\0') return false;
  const std::string_view v(e);
  if (v == "off") return true;
  if (v != "auto" && v != "on") {
    log::get("mem")->warn("FERRY_VMM={} is not off, on or auto: treated as auto", v);
  }
  return false;
}

// A detail status's message as a clause ("mem: device 0 lacks ..." -> "device 0 lacks ...").
std::string_view clause(const Status& st) {
  std::string_view m = st.message();
  if (m.starts_with("mem: ")) m.remove_prefix(5);
  return m;
}
}  // namespace

std::string_view to_string(RegionBacking b) {
  switch (b) {
    case RegionBacking::kAuto:
      return "auto";
    case RegionBacking::kWholeUpFront:
      return "whole-up-front";
  }
  return "?";
}

Result<std::size_t> VirtualRegion::tier_granularity(MemTier tier, int device) {
  if (tier == MemTier::kDevice) {
    Result<std::size_t> g = detail::device_vmm_granularity(device);
    // No VMM: such regions are backed up front, and the granule only rounds the bookkeeping.
    if (!g.ok() && g.status().code() == StatusCode::kUnavailable) {
      return detail::kHostVmmGranularity;
    }
    return g;
  }
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
  const std::size_t min_gran = host_memory_tier(tier) ? detail::kPageBytes : tier_gran;
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
  r.size_ = size;
  r.budget_ = &budget;
  r.committed_.assign(size / gran, 0);
  // Granule by granule unless asked otherwise or the device cannot (why: non-empty then).
  std::string why;
  if (opts.backing == RegionBacking::kWholeUpFront) {
    why = "whole-up-front backing asked for";
  } else if (vmm_off_by_env()) {
    why = "FERRY_VMM=off";
  } else if (device_tier(tier) && !detail::device_tier_emulated()) {
    if (Status st = detail::device_vmm_supported(opts.device); !st.ok()) {
      if (st.code() != StatusCode::kUnavailable) return st;
      why = clause(st);
    }
  }
  if (why.empty()) {
    Result<std::byte*> base = device_tier(tier)
                                  ? detail::device_vmm_reserve(size, gran, opts.device, opts.what)
                                  : detail::host_vmm_reserve(size, opts.what);
    if (base.ok()) {
      r.base_ = *base;
      r.handle_.assign(size / gran, 0);
      return r;
    }
    if (base.status().code() != StatusCode::kUnavailable) return std::move(base).take_status();
    why = clause(base.status());
  }
  FERRY_TRY(r.reserve_up_front(opts, why));
  return r;
}

Status VirtualRegion::reserve_up_front(const VirtualRegionOptions& opts, std::string_view why) {
  const auto allocate = [&]() -> Result<std::byte*> {
    if (opts.up_front_limit_bytes != 0 && size_ > opts.up_front_limit_bytes) {
      return resource_exhausted("need {}, allowed {} (up_front_limit_bytes)", format_bytes(size_),
                                format_bytes(opts.up_front_limit_bytes));
    }
    return device_tier(tier_) ? detail::device_up_front_alloc(size_, device_)
                              : detail::host_up_front_alloc(size_);
  };
  Result<std::byte*> base = allocate();
  if (!base.ok()) {
    const Status& st = base.status();
    return Status(st.code(), fmt::format("mem: {}: {}, so its whole {} range had to be allocated "
                                         "up front, and that failed: {}",
                                         what_, why, format_bytes(size_), clause(st)));
  }
  base_ = *base;
  up_front_ = true;
  // Said once per region where the caller did not ask for it: the pool then holds its maximum,
  // not its live size, and `ferry serve` users should see why.
  if (opts.backing == RegionBacking::kAuto) {
    log::get("mem")->warn(
        "virtual region what=\"{}\" backing=whole-up-front held_mib={:.1f} reason=\"{}\": all of "
        "it is held from now on, not only the committed granules",
        what_, double(size_) / double(1 << 20), why);
  }
  return ok_status();
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
    up_front_ = std::exchange(other.up_front_, false);
    committed_granules_ = std::exchange(other.committed_granules_, 0);
    peak_granules_ = std::exchange(other.peak_granules_, 0);
  }
  return *this;
}

VirtualRegion::~VirtualRegion() { reset(); }

void VirtualRegion::reset() {
  if (base_ == nullptr) return;
  if (up_front_) {
    budget_->release(committed_granules_ * gran_);
    committed_granules_ = 0;
    if (device_tier(tier_)) {
      detail::device_up_front_free(base_, size_, device_);
    } else {
      detail::host_up_front_free(base_, size_);
    }
  } else {
    for (std::size_t g = 0; g < committed_.size(); ++g) {
      if (committed_[g]) unmap_granule(g);
    }
    if (device_tier(tier_)) {
      detail::device_vmm_free(base_, size_, device_);
    } else {
      detail::host_vmm_free(base_, size_);
    }
  }
  base_ = nullptr;
  size_ = 0;
  budget_ = nullptr;
  up_front_ = false;
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
  if (up_front_) {
    // The memory stays; on the host tiers it is zeroed so that a re-commit reads zeros, as a
    // fresh mapping does (the contract of the file comment).
    if (host_memory_tier(tier_)) std::memset(at, 0, gran_);
  } else if (device_tier(tier_)) {
    detail::device_vmm_unmap(at, gran_, handle_[g], device_);
    handle_[g] = 0;
  } else {
    detail::host_vmm_unmap(at, gran_);
  }
  committed_[g] = 0;
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
  if (up_front_) {  // already backed: only the bookkeeping (and the charge above)
    for (std::size_t g = g0; g < g1; ++g) committed_[g] = 1;
    committed_granules_ += fresh;
    if (committed_granules_ > peak_granules_) peak_granules_ = committed_granules_;
    return ok_status();
  }
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
