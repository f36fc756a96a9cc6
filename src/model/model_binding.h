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

#include "model/config.h"
#include "model/model_compute.h"
#include "model/weights.h"

namespace ferry::model {

Result<DecoderGeometry> make_geometry(const ModelConfig& config);

// The view of `params` that parameter `spec` binds to (its ParamSpec role -> the ModelParams
// field; layers and expert lists are sized from `g` on first use). A spec whose role does not
// fit its layer/global position is a bug.
ConstTensorView* param_slot(ModelParams& params, const ParamSpec& spec, const DecoderGeometry& g);

struct LoadedModel {
  ModelConfig config;
  DecoderGeometry geometry;
  ModelParams params;                                          // views into `weights`
  std::vector<std::pair<std::string, ConstTensorView>> named;  // param_specs order
  std::unique_ptr<ModelWeights> weights;                       // owns mapping and copies
};

// Loads config.json and the safetensors (single file or sharded index) of `dir` through
// ModelWeights (which validates presence, dtype and shape of every tensor) in f32.
Result<std::unique_ptr<LoadedModel>> load_model_f32(const std::string& dir);

struct GradStorage {
  ModelGrads grads;
  std::vector<std::pair<std::string, TensorView>> named;  // same order as LoadedModel::named
  std::vector<std::vector<float>> bufs;

  static Result<std::unique_ptr<GradStorage>> create(const LoadedModel& model);
  // The same layout from the parameter specs (a model known by its config only).
  static Result<std::unique_ptr<GradStorage>> create(const std::vector<ParamSpec>& specs,
                                                     const DecoderGeometry& geometry);
  void zero();
};

}  // namespace ferry::model
