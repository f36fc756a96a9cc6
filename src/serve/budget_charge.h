// SPDX-License-Identifier: Apache-2.0
// BudgetCharge: a move-only hold of `bytes` on a MemoryBudget, released when it dies. The engine's
// one device budget (EngineConfig::device_budget_bytes) is a parent of the per-component budgets
// (KV pool, expert slots or staging): each component charges its own budget through its Arena and
// also holds a BudgetCharge on the shared one, so the sum of the parts is checked against one
// hard limit and its peak is reported. The shared budget must outlive every charge on it.
#pragma once

#include <cstddef>
#include <string_view>

#include "core/result.h"
#include "mem/budget.h"

namespace ferry::serve {

class BudgetCharge {
 public:
  BudgetCharge() = default;
  // budget == nullptr: an empty charge (no shared budget configured).
  static Result<BudgetCharge> take(mem::MemoryBudget* budget, std::size_t bytes,
                                   std::string_view what) {
    BudgetCharge c;
    if (budget == nullptr) return c;
    if (bytes > 0) FERRY_TRY(budget->reserve(bytes, what));
    c.budget_ = budget;
    c.bytes_ = bytes;
    return c;
  }
  // Changes the held bytes (MV-WSA resizes): growth is reserved first (resource_exhausted leaves
  // the charge as it was), shrinkage released. Without a budget only the count changes.
  Status resize(std::size_t bytes, std::string_view what) {
    if (budget_ != nullptr && bytes > bytes_) FERRY_TRY(budget_->reserve(bytes - bytes_, what));
    if (budget_ != nullptr && bytes < bytes_) budget_->release(bytes_ - bytes);
    bytes_ = bytes;
    return ok_status();
  }
  // What the shared budget can still give (unlimited without one).
  std::size_t budget_free() const {
    return budget_ != nullptr ? budget_->bytes_free() : mem::MemoryBudget::kUnlimited;
  }
  BudgetCharge(BudgetCharge&& o) noexcept : budget_(o.budget_), bytes_(o.bytes_) {
    o.budget_ = nullptr;
    o.bytes_ = 0;
  }
  BudgetCharge& operator=(BudgetCharge&& o) noexcept {
    if (this != &o) {
      reset();
      budget_ = o.budget_;
      bytes_ = o.bytes_;
      o.budget_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  BudgetCharge(const BudgetCharge&) = delete;
  BudgetCharge& operator=(const BudgetCharge&) = delete;
  ~BudgetCharge() { reset(); }
  void reset() {
    if (budget_ != nullptr && bytes_ > 0) budget_->release(bytes_);
    budget_ = nullptr;
    bytes_ = 0;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  mem::MemoryBudget* budget_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace ferry::serve
