// SPDX-License-Identifier: Apache-2.0
#include "core/cpu_info.h"

#include <fstream>

namespace ferry {

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto pos = line.find(':');
      return pos == std::string::npos || pos + 2 > line.size() ? line : line.substr(pos + 2);
    }
  }
  return "unknown";
}

}  // namespace ferry
