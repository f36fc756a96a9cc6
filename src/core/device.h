// SPDX-License-Identifier: Apache-2.0
// Where computation runs. Opaque Stream/Event handles live in mem/stream.h.
#pragma once

#include <cstdint>
#include <string_view>

namespace ferry {

enum class Device : std::uint8_t { kCpu, kCuda };

inline std::string_view to_string(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

}  // namespace ferry
