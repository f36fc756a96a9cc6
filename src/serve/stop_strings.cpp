// SPDX-License-Identifier: Apache-2.0
// See stop_strings.h.
#include "serve/stop_strings.h"

#include <algorithm>

namespace ferry::serve {

std::size_t first_stop_match(std::string_view previous, std::string_view text,
                             std::span<const std::string> stops) {
  const std::size_t common = static_cast<std::size_t>(
      std::mismatch(previous.begin(), previous.end(), text.begin(), text.end()).second -
      text.begin());
  if (common == text.size()) return std::string_view::npos;  // nothing new (or text shrank)
  std::size_t cut = std::string_view::npos;
  for (const std::string& stop : stops) {
    if (stop.empty()) continue;
    const std::size_t from = common >= stop.size() - 1 ? common - (stop.size() - 1) : 0;
    cut = std::min(cut, text.find(stop, from));
  }
  return cut;
}

std::size_t first_stop_match_whole(std::string_view text, std::span<const std::string> stops) {
  std::size_t cut = std::string_view::npos;
  for (const std::string& stop : stops) {
    if (!stop.empty()) cut = std::min(cut, text.find(stop));
  }
  return cut;
}

}  // namespace ferry::serve
