// SPDX-License-Identifier: Apache-2.0
// Everything the in-memory executor keeps resident for one model: fp32 master weights (copied
// from the loaded checkpoint, so the source folder is never written), fp32 gradients and the
// AdamW moments m, v — four GradStorage buffers bound to the same ModelTensors layout, plus the
// per-parameter weight-decay flag (no decay on norms and biases).
// Ownership: TrainState owns all four; `params` are const views into `master`.
// Tests: tests/unit/train/optimizer_test.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/model_binding.h"

namespace ferry::train {

struct TrainState {
  model::ModelConfig config;
  model::DecoderGeometry geometry;
  std::unique_ptr<model::GradStorage> master;  // writable f32 weights, named in checkpoint order
  std::unique_ptr<model::GradStorage> grads;
  std::unique_ptr<model::GradStorage> m;
  std::unique_ptr<model::GradStorage> v;
  model::ModelParams params;  // views of master
  std::vector<bool> decay;    // [num params]

  static Result<std::unique_ptr<TrainState>> from_loaded(const model::LoadedModel& loaded);
  std::size_t num_params() const { return master->named.size(); }
  std::int64_t num_elements() const;
};

// Weight decay applies to matrices only: not to norms (name contains "norm") nor biases.
bool decays(const std::string& param_name);

// Same layout, read-only views.
model::ModelParams as_params(const model::ModelGrads& g);

}  // namespace ferry::train
