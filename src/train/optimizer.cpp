// SPDX-License-Identifier: Apache-2.0
#include "train/optimizer.h"

#include <cmath>

#include "mem/stream.h"

namespace ferry::train {

namespace {

TensorView flat(const TensorView& v) {
  return TensorView::contiguous(v.data, v.dtype, v.device, {v.numel()});
}

}  // namespace

double clip_scale(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

Result<double> grad_global_norm(const TrainState& s, int accum, kernels::Backend& be) {
  double total = 0.0;
  float part = 0.0f;
  const TensorView out = TensorView::contiguous(&part, DType::kF32, Device::kCpu, {1});
  for (const auto& [name, g] : s.grads->named) {
    FERRY_TRY(be.sum_squares({.out = out, .x = flat(g)}, mem::Stream::host()));
    total += static_cast<double>(part);
  }
  return std::sqrt(total) / static_cast<double>(accum);
}

Result<StepOutcome> optimizer_step(TrainState& s, const AdamWConfig& cfg, double lr,
                                   std::int64_t opt_step, int accum, kernels::Backend& be) {
  StepOutcome o;
  FERRY_ASSIGN_OR_RETURN(o.grad_norm, grad_global_norm(s, accum, be));
  if (!std::isfinite(o.grad_norm)) return o;
  o.clip = clip_scale(o.grad_norm, cfg.max_grad_norm);
  const float grad_scale = static_cast<float>(o.clip / static_cast<double>(accum));
  for (std::size_t i = 0; i < s.num_params(); ++i) {
    const kernels::AdamWArgs a{
        .param = flat(s.master->named[i].second),
        .m = flat(s.m->named[i].second),
        .v = flat(s.v->named[i].second),
        .param_bf16 = {},
        .grad = flat(s.grads->named[i].second),
        .lr = static_cast<float>(lr),
        .beta1 = static_cast<float>(cfg.beta1),
        .beta2 = static_cast<float>(cfg.beta2),
        .eps = static_cast<float>(cfg.eps),
        .weight_decay = s.decay[i] ? static_cast<float>(cfg.weight_decay) : 0.0f,
        .grad_scale = grad_scale,
        .step = opt_step};
    FERRY_TRY(be.adamw(a, mem::Stream::host()));
  }
  o.applied = true;
  return o;
}

}  // namespace ferry::train
