// SPDX-License-Identifier: Apache-2.0
// Everything the in-memory executor keeps resident for one model: f32 weights (copied from the
// loaded checkpoint, so the source folder is never written), fp32 gradients and the AdamW
// moments m, v — GradStorage buffers bound to the same ModelTensors layout — plus the
// per-parameter weight-decay flag (no decay on norms and biases) and the hybrid optimizer's
// storage (optim/optim_state.h) for the non-default modes:
//   master fp32:       `master` is the f32 master; bf16 masters: `master` is the f32 compute view
//                      of the bf16 weights in optim.params[i].w16 (rewritten by every update);
//   states fp32:       `m`, `v` hold the moments; 8bit: the codes live in optim.params[i], and
//                      `m`, `v` are null unless --8bit-params left some parameter with f32
//                      states (then they are allocated for all, used for those only).
// bf16 compute weights with an fp32 master (use_bf16_compute; what the GPU streaming trainer runs
// by default, Megatron/DeepSpeed bf16 semantics): `compute` holds the f32 values of the master
// rounded to bf16 (round to nearest even) — exactly what the stream executor widens from its
// bf16 streaming copy — and `params` view it; refresh_compute() after every change of the master
// (optimizer_step, checkpoint load). bf16 masters compute with their bf16 weights already.
// Ownership: TrainState owns everything; `params` are const views into `master` (or `compute`).
// Tests: tests/unit/train/optimizer_test.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/model_binding.h"
#include "train/optim/optim_state.h"

namespace ferry::train {

struct TrainState {
  model::ModelConfig config;
  model::DecoderGeometry geometry;
  std::unique_ptr<model::GradStorage> master;  // writable f32 weights, named in checkpoint order
  std::unique_ptr<model::GradStorage> grads;
  std::unique_ptr<model::GradStorage> m;  // when some parameter keeps f32 states
  std::unique_ptr<model::GradStorage> v;
  HybridOptimState optim;                       // mode + bf16 weights / 8-bit codes
  model::ModelParams params;                    // views of master (or of compute)
  std::vector<bool> decay;                      // [num params]
  std::unique_ptr<model::GradStorage> compute;  // fp32 master + bf16 compute only
  // bf16 gradients (--grad-dtype bf16): the accumulated gradient is rounded to bf16 (nearest
  // even) after every micro-batch — what the stream executor's bf16 host gradients and D2H hold —
  // and the clip norm and the update read the rounded values. Off: f32 throughout.
  bool bf16_grads = false;

  // Forward and backward read bf16-rounded weights from now on (allocates `compute`, rebinds
  // `params`). A no-op for bf16 masters.
  Status use_bf16_compute();
  // compute = bf16(master) (nothing without `compute`).
  void refresh_compute();
  // With bf16_grads: every gradient element := its bf16 rounding (after each micro-batch).
  void round_grads_to_bf16();
  // The weights the model computes with are bf16 values (bf16 master or bf16 compute).
  bool bf16_weights() const { return optim.mode.master != MasterWeights::kF32 || compute; }

  // sr_seed keys stochastic rounding (bf16-sr); the trainer passes --seed. q8[i]: parameter i
  // keeps 8-bit states (8bit mode; empty = all, param_selection.h).
  static Result<std::unique_ptr<TrainState>> from_loaded(const model::LoadedModel& loaded,
                                                         const OptimMode& mode = {},
                                                         std::uint64_t sr_seed = 0,
                                                         const std::vector<bool>& q8 = {});
  std::size_t num_params() const { return master->named.size(); }
  std::int64_t num_elements() const;
};

// Weight decay applies to matrices only: not to norms (name contains "norm") nor biases.
bool decays(const std::string& param_name);

// Same layout, read-only views.
model::ModelParams as_params(const model::ModelGrads& g);

}  // namespace ferry::train
