// SPDX-License-Identifier: Apache-2.0
// The process's own memory figures (Linux): what `ferry train` reports as peak host memory.
#pragma once

#include <cstddef>

namespace ferry {

// Peak resident set size of this process so far (getrusage ru_maxrss), 0 if unavailable.
std::size_t host_peak_rss_bytes();

}  // namespace ferry
