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
    if (budget == nullptr || bytes == 0) return c;
    FERRY_TRY(budget->reserve(bytes, what));
    c.budget_ = budget;
    c.bytes_ = bytes;
    return c;
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
    if (budget_ != nullptr) budget_->release(bytes_);
    budget_ = nullptr;
    bytes_ = 0;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  mem::MemoryBudget* budget_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace ferry::serve
