// SPDX-License-Identifier: Apache-2.0
// What machine this is, for benchmark reports (Linux): the CPU's model name.
#pragma once

#include <string>

namespace ferry {

// The first "model name" of /proc/cpuinfo, or "unknown".
std::string cpu_model_name();

}  // namespace ferry
