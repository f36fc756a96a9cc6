// SPDX-License-Identifier: Apache-2.0
// Result<T>: a value or a non-ok Status (std::expected is C++23; tl-expected is not in bookworm).
// Accessing value() of an error Result is a bug and aborts.
#pragma once

#include <type_traits>
#include <utility>
#include <variant>

#include "core/check.h"
#include "core/status.h"

namespace ferry {

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    FERRY_CHECK(!std::get<Status>(v_).ok(), "Result constructed from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }

  T& value() & {
    FERRY_CHECK(ok(), "Result::value() on error: {}", std::get<Status>(v_).to_string());
    return std::get<T>(v_);
  }
  const T& value() const& {
    FERRY_CHECK(ok(), "Result::value() on error: {}", std::get<Status>(v_).to_string());
    return std::get<T>(v_);
  }
  T&& value() && {
    FERRY_CHECK(ok(), "Result::value() on error: {}", std::get<Status>(v_).to_string());
    return std::move(std::get<T>(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  // Takes the Status out (only meaningful when !ok()).
  Status take_status() && { return ok() ? Status{} : std::move(std::get<Status>(v_)); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ferry

// FERRY_ASSIGN_OR_RETURN(auto x, make_x());  declares x from a Result or returns its Status.
#define FERRY_ASSIGN_OR_RETURN(lhs, expr) \
  FERRY_ASSIGN_OR_RETURN_IMPL_(FERRY_CONCAT_(ferry_r_, __COUNTER__), lhs, expr)
#define FERRY_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)  \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).take_status(); \
  lhs = std::move(tmp).value()
