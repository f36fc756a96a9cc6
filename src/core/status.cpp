// SPDX-License-Identifier: Apache-2.0
#include "core/status.h"

#include <cstring>

namespace ferry {

std::string_view to_string(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kCorrupt:
      return "corrupt";
    case StatusCode::kOutOfRange:
      return "out_of_range";
    case StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case StatusCode::kUnimplemented:
      return "unimplemented";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kIo:
      return "io";
    case StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case StatusCode::kCancelled:
      return "cancelled";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return fmt::format("{}: {}", ferry::to_string(code_), message_);
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return {code_, fmt::format("{}: {}", context, message_)};
}

Status errno_status(std::string_view what, std::string_view path, int err) {
  return {StatusCode::kIo, fmt::format("{}: {}: {}", what, path, std::strerror(err))};
}

}  // namespace ferry
