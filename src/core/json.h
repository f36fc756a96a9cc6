// SPDX-License-Identifier: Apache-2.0
// JSON through nlohmann::json, plus a parse that returns Result instead of throwing (src/ has no
// exceptions escaping it).
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace ferry {

using Json = nlohmann::json;

// what: names the document in the error ("config.json", "safetensors header").
Result<Json> parse_json(std::string_view text, std::string_view what);

}  // namespace ferry
