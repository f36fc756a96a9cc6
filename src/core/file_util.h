// SPDX-License-Identifier: Apache-2.0
// Small file helpers that return Status: read a whole file, write atomically (temp + fsync +
// rename).
#pragma once

#include <string>
#include <string_view>

#include "core/result.h"

namespace ferry {

Result<std::string> read_file(const std::string& path);
// Writes to path.tmp.<pid>, fsyncs it, renames over path and fsyncs the directory.
Status write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace ferry
