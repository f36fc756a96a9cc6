// SPDX-License-Identifier: Apache-2.0
// One optimizer step over a TrainState: global-norm clipping folded into AdamW's grad_scale.
//   1. sum_squares(g_p) per parameter (kernels::SumSquaresArgs) -> partials, combined in f64 by
//      clip_from_partials into ||G||, where G = (sum of micro-batch gradients) / accum is the
//      step's gradient (the streaming executor hands in per-layer partials from the GPU instead);
//   2. scale = clip_scale(||G||, max_norm) / accum  (no separate pass over the gradients);
//   3. the fused AdamW update per parameter with grad_scale = scale, weight decay only where
//      TrainState::decay says so: Backend::adamw for fp32 master + fp32 states (the reference
//      path), the hybrid kernel (optim/hybrid_update.h) for every other (master, states) mode.
// A non-finite ||G|| skips step 3 (nothing is updated; the caller counts consecutive skips).
// Tests: tests/unit/train/optimizer_test.cpp, hybrid_optimizer_test.cpp (clip scale vs
// reference global-norm clipping, for every mode).
#pragma once

#include <cstdint>
#include <span>

#include "core/result.h"
#include "kernels/backend.h"
#include "train/train_state.h"

namespace ferry::train {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double max_grad_norm = 1.0;  // <= 0: no clipping
};

// PyTorch clip_grad_norm_'s factor: min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0.
double clip_scale(double norm, double max_norm);

struct StepOutcome {
  double grad_norm = 0.0;  // ||G|| before clipping
  double clip = 1.0;       // clip factor applied
  bool applied = false;    // false when the gradient was not finite
};

struct ClipResult {
  double norm = 0.0;  // ||G|| = sqrt(sum of partials) / accum
  double clip = 1.0;  // clip_scale(norm, max_norm)
};
// Fast clipping: combines sums of squares of the accumulated gradients (one per parameter, or
// per layer) into ||G|| and the clip factor, in f64, in the order given.
ClipResult clip_from_partials(std::span<const double> sumsq, int accum, double max_norm);

// Sum of squares of each accumulated gradient, in parameter order.
Result<std::vector<double>> grad_sumsq_partials(const TrainState& s, kernels::Backend& be);

// Global L2 norm of the accumulated gradients divided by accum.
Result<double> grad_global_norm(const TrainState& s, int accum, kernels::Backend& be);

// opt_step: 1-based AdamW step (bias correction) used when the update is applied.
Result<StepOutcome> optimizer_step(TrainState& s, const AdamWConfig& cfg, double lr,
                                   std::int64_t opt_step, int accum, kernels::Backend& be);

}  // namespace ferry::train
