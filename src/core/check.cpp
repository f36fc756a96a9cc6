// SPDX-License-Identifier: Apache-2.0
#include "core/check.h"

#include <cstdio>
#include <cstdlib>

namespace ferry::detail {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "ferry: check failed: %s at %s:%d: %s\n", expr, file, line, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace ferry::detail
