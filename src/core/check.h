// SPDX-License-Identifier: Apache-2.0
// FERRY_CHECK: a broken invariant (a bug) aborts in all builds with the expression, a formatted
// message and file:line. Expected runtime conditions return Status instead (status.h).
// FERRY_DCHECK is for hot loops and compiles away in release builds.
#pragma once

#include <string>

#include <fmt/format.h>

namespace ferry::detail {
[[noreturn]] void check_failed(const char* expr, const char* file, int line,
                               const std::string& msg);
}  // namespace ferry::detail

#define FERRY_CHECK(cond, ...)                                                              \
  do {                                                                                      \
    if (!(cond)) [[unlikely]]                                                               \
      ::ferry::detail::check_failed(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)

#ifdef NDEBUG
#define FERRY_DCHECK(cond, ...) \
  do {                          \
  } while (0)
#else
#define FERRY_DCHECK(cond, ...) FERRY_CHECK(cond, __VA_ARGS__)
#endif

// For tests, benches and main only: abort when a Status is not ok.
#define FERRY_CHECK_OK(expr)                                                           \
  do {                                                                                 \
    if (const ::ferry::Status ferry_cs_ = (expr); !ferry_cs_.ok())                     \
      ::ferry::detail::check_failed(#expr, __FILE__, __LINE__, ferry_cs_.to_string()); \
  } while (0)
