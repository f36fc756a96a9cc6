// SPDX-License-Identifier: Apache-2.0
#include "core/json.h"

namespace ferry {

Result<Json> parse_json(std::string_view text, std::string_view what) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return corrupt("{}: not valid JSON", what);
  return j;
}

}  // namespace ferry
