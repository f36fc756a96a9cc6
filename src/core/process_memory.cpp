// SPDX-License-Identifier: Apache-2.0
#include "core/process_memory.h"

#include <sys/resource.h>

namespace ferry {

std::size_t host_peak_rss_bytes() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0 || u.ru_maxrss < 0) return 0;
  return static_cast<std::size_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace ferry
