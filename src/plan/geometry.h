// SPDX-License-Identifier: Apache-2.0
// Built-in model geometries for planning without a download: the published config.json values
// (hidden size, layers, heads, MLP width, vocab, tying) of a few Qwen2.5 models, parsed by the
// same model::parse_model_config as a real folder. Only the shape matters to the planner.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "model/config.h"

namespace ferry::plan {

// "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b".
std::vector<std::string> builtin_geometry_names();
Result<model::ModelConfig> builtin_geometry(std::string_view name);

}  // namespace ferry::plan
