// SPDX-License-Identifier: Apache-2.0
// Binds a Hugging Face model folder to the compute: config.json -> DecoderGeometry, and every
// checkpoint tensor (by its ParamSpec role) -> the ModelParams views ModelCompute reads.
// LoadedModel owns the checkpoint mapping and any converted copies; views point into them.
// GradStorage owns one zeroed f32 gradient buffer per parameter, bound the same way.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/model_compute.h"

namespace ferry::model {

Result<DecoderGeometry> make_geometry(const ModelConfig& config);

struct LoadedModel {
  ModelConfig config;
  DecoderGeometry geometry;
  ModelParams params;
  std::vector<std::pair<std::string, ConstTensorView>> named;  // checkpoint name -> f32 view
  std::vector<std::vector<float>> owned;  // f32 copies of tensors stored in another dtype
  std::unique_ptr<Checkpoint> checkpoint;
};

// Loads config.json and the safetensors (single file or sharded index) of `dir`, validating every
// tensor's presence, dtype and shape; tensors not stored as f32 are converted to f32 copies.
Result<std::unique_ptr<LoadedModel>> load_model_f32(const std::string& dir);

struct GradStorage {
  ModelGrads grads;
  std::vector<std::pair<std::string, TensorView>> named;  // same order as LoadedModel::named
  std::vector<std::vector<float>> bufs;

  static Result<std::unique_ptr<GradStorage>> create(const LoadedModel& model);
  void zero();
};

}  // namespace ferry::model
