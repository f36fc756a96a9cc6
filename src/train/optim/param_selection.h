// SPDX-License-Identifier: Apache-2.0
// Which parameters keep 8-bit AdamW states (`--8bit-params REGEX`, docs/optimizer.md): an
// ECMAScript regular expression searched (std::regex_search) in each Hugging Face parameter
// name, e.g. `mlp|experts`; empty = every parameter. A selection that matches nothing is refused
// (it would silently mean "fp32 states everywhere"). Pure functions. Tests:
// tests/unit/train/q8_selection_test.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace ferry::train {

Result<std::vector<bool>> select_8bit_params(const std::vector<std::string>& names,
                                             std::string_view regex);

}  // namespace ferry::train
