// SPDX-License-Identifier: Apache-2.0
// A JSON array of per-item flags (the plan documents' keep_internals: plan/plan_json.cpp,
// train/stream/plan_policy.cpp), read one way in both places.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "core/result.h"

namespace ferry {

// j must be an array of exactly n flags, each true/false or the integer 0/1 (compared as 64-bit:
// 2^32 + 1 is not 1). Anything else is corrupt, naming `what` (e.g. "plan x.json: keep_internals")
// and the offending index.
Result<std::vector<bool>> flag_array(const Json& j, std::size_t n, std::string_view what);

}  // namespace ferry
