// SPDX-License-Identifier: Apache-2.0
#include "core/json_flags.h"

#include <cstdint>

namespace ferry {

Result<std::vector<bool>> flag_array(const Json& j, std::size_t n, std::string_view what) {
  if (!j.is_array() || j.size() != n) return corrupt("{} is not an array of {} flags", what, n);
  std::vector<bool> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Json& v = j.at(i);
    if (v.is_boolean()) {
      out.push_back(v.get<bool>());
    } else if (v.is_number_integer() &&
               (v.get<std::int64_t>() == 0 || v.get<std::int64_t>() == 1)) {
      out.push_back(v.get<std::int64_t>() == 1);
    } else {
      return corrupt("{}[{}] is {}, not a boolean or 0/1", what, i, v.dump());
    }
  }
  return out;
}

}  // namespace ferry
