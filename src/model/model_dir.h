// SPDX-License-Identifier: Apache-2.0
// Layout of a Hugging Face model folder: config.json, *.safetensors (or an index), tokenizer.json.
#pragma once

#include <string>

namespace ferry::model {

inline std::string config_path(const std::string& dir) { return dir + "/config.json"; }
inline std::string tokenizer_path(const std::string& dir) { return dir + "/tokenizer.json"; }
inline std::string safetensors_index_path(const std::string& dir) {
  return dir + "/model.safetensors.index.json";
}

}  // namespace ferry::model
