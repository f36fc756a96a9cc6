// SPDX-License-Identifier: Apache-2.0
// Status: the result of an operation that can fail for an expected reason (out of budget, corrupt
// file, unsupported shape). Bugs do not return a Status; they abort through FERRY_CHECK (check.h).
// Messages are lowercase, start with the subsystem, and say what, which object, needed vs
// available.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace ferry {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,    // the caller passed something malformed (bad flag, bad config value)
  kNotFound,           // a file, tensor or key that must exist does not
  kCorrupt,            // a file exists but its contents are malformed
  kOutOfRange,         // an offset or index outside its container
  kResourceExhausted,  // a memory budget or capacity would be exceeded
  kUnimplemented,      // a valid request this build/backend does not support
  kUnavailable,        // a resource is absent (no GPU, built without CUDA, server down)
  kIo,                 // an operating-system I/O call failed
  kDeadlineExceeded,   // a timeout
  kCancelled,          // the operation was cancelled
  kInternal,           // a dependency returned an error we cannot classify
};

std::string_view to_string(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "resource_exhausted: mem: ..." — suitable for a log line or a CLI error.
  std::string to_string() const;

  // Returns a copy whose message is "context: <original message>".
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return {}; }

template <typename... Args>
Status invalid_argument(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status not_found(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status corrupt(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kCorrupt, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status out_of_range(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kOutOfRange, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status resource_exhausted(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kResourceExhausted, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status unimplemented(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kUnimplemented, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status unavailable(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kUnavailable, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status io_error(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kIo, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status deadline_exceeded(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kDeadlineExceeded, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status cancelled(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kCancelled, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status internal_error(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...)};
}

// errno-based I/O error: "what: path: strerror(err)".
Status errno_status(std::string_view what, std::string_view path, int err);

}  // namespace ferry

#define FERRY_CONCAT_INNER_(a, b) a##b
#define FERRY_CONCAT_(a, b) FERRY_CONCAT_INNER_(a, b)

// Propagates a non-ok Status out of the enclosing function (which returns Status or Result<T>).
// The temporary's name is unique per expansion so FERRY_TRY nests (e.g. inside a lambda that is
// itself an argument of FERRY_TRY) without shadowing.
#define FERRY_TRY(expr) FERRY_TRY_IMPL_(FERRY_CONCAT_(ferry_s_, __COUNTER__), expr)
#define FERRY_TRY_IMPL_(tmp, expr)                           \
  do {                                                       \
    if (::ferry::Status tmp = (expr); !tmp.ok()) return tmp; \
  } while (0)
