// SPDX-License-Identifier: Apache-2.0
// Test helper: an environment variable set (or unset) for a scope, restored afterwards. For the
// switches the code reads from the environment at each call (FERRY_SCRATCH_OVERLAY,
// FERRY_ROUTE_DW, ...).
#pragma once

#include <cstdlib>
#include <string>

namespace ferry::testing {

// Sets `var` to `value` (nullptr: unsets) for the object's lifetime.
class ScopedEnv {
 public:
  ScopedEnv(const char* var, const char* value) : var_(var) {
    const char* old = std::getenv(var);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) {
      setenv(var, value, 1);
    } else {
      unsetenv(var);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(var_, old_.c_str(), 1);
    } else {
      unsetenv(var_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* var_;
  bool had_ = false;
  std::string old_;
};

}  // namespace ferry::testing
