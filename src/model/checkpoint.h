// SPDX-License-Identifier: Apache-2.0
// Checkpoint: every tensor of a Hugging Face model folder, whether it is one model.safetensors or
// shards listed by model.safetensors.index.json ({"metadata": {...}, "weight_map": {name: file}}).
// Validation: every shard the index references exists and parses; every tensor the weight_map
// names is in the shard it points to; a tensor name found in two shards is an error (kCorrupt);
// shard file names must stay inside the folder (no '/', no "..").
// Tensors in a shard but absent from the weight_map are still served (the shard is authoritative
// about its contents) and logged as a warning.
// Views point into the shards' mappings and live as long as the Checkpoint (moving it keeps them
// valid: shards are heap-allocated).
// Tests: tests/unit/model/checkpoint_test.cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/safetensors.h"

namespace ferry::model {

class Checkpoint {
 public:
  struct Entry {
    const SafetensorsFile* file = nullptr;
    const TensorInfo* info = nullptr;
  };

  // `path` is a model folder (model.safetensors.index.json preferred, else model.safetensors),
  // an index .json file, or a single .safetensors file.
  static Result<Checkpoint> open(const std::string& path);
  static Result<Checkpoint> open_index(const std::string& index_path);
  static Result<Checkpoint> open_file(const std::string& safetensors_path);

  const Entry* find(std::string_view name) const;
  // kNotFound "model: tensor X not found in checkpoint <path>".
  Result<Entry> get(std::string_view name) const;
  // Zero-copy view, optionally checked against dtype and shape.
  Result<ConstTensorView> view(std::string_view name) const;
  Result<ConstTensorView> view(std::string_view name, DType dtype,
                               std::span<const std::int64_t> shape) const;

  std::vector<std::string> names() const;  // sorted
  std::size_t num_tensors() const { return entries_.size(); }
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  const std::string& path() const { return path_; }

 private:
  Status add_shard(std::unique_ptr<SafetensorsFile> shard);

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace ferry::model
