// SPDX-License-Identifier: Apache-2.0
#include "train/optimizer.h"

#include <cmath>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/hybrid_adamw.h"
#include "mem/stream.h"
#include "train/optim/hybrid_update.h"

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

ClipResult clip_from_partials(std::span<const double> sumsq, int accum, double max_norm) {
  double total = 0.0;
  for (double p : sumsq) total += p;
  ClipResult r;
  r.norm = std::sqrt(total) / static_cast<double>(accum);
  r.clip = clip_scale(r.norm, max_norm);
  return r;
}

Result<std::vector<double>> grad_sumsq_partials(const TrainState& s, kernels::Backend& be) {
  std::vector<double> partials;
  partials.reserve(s.num_params());
  float part = 0.0f;
  const TensorView out = TensorView::contiguous(&part, DType::kF32, Device::kCpu, {1});
  for (const auto& [name, g] : s.grads->named) {
    FERRY_TRY(be.sum_squares({.out = out, .x = flat(g)}, mem::Stream::host()));
    partials.push_back(static_cast<double>(part));
  }
  return partials;
}

Result<double> grad_global_norm(const TrainState& s, int accum, kernels::Backend& be) {
  FERRY_ASSIGN_OR_RETURN(const std::vector<double> partials, grad_sumsq_partials(s, be));
  return clip_from_partials(partials, accum, 0.0).norm;
}

Result<StepOutcome> optimizer_step(TrainState& s, const AdamWConfig& cfg, double lr,
                                   std::int64_t opt_step, int accum, kernels::Backend& be) {
  StepOutcome o;
  FERRY_ASSIGN_OR_RETURN(const std::vector<double> partials, grad_sumsq_partials(s, be));
  const ClipResult clip = clip_from_partials(partials, accum, cfg.max_grad_norm);
  o.grad_norm = clip.norm;
  if (!std::isfinite(o.grad_norm)) return o;
  o.clip = clip.clip;
  const float grad_scale = static_cast<float>(o.clip / static_cast<double>(accum));
  if (s.optim.mode != OptimMode{}) {
    if (!(cfg.beta1 >= 0.0 && cfg.beta1 < 1.0) || !(cfg.beta2 >= 0.0 && cfg.beta2 < 1.0)) {
      return invalid_argument("train: betas ({}, {}) must lie in [0, 1)", cfg.beta1, cfg.beta2);
    }
    if (opt_step < 1) return invalid_argument("train: AdamW step {} < 1", opt_step);
    const kernels::cpu::Isa isa = kernels::cpu::best_isa();
    for (std::size_t i = 0; i < s.num_params(); ++i) {
      const kernels::cpu::AdamWConstants k = kernels::cpu::make_adamw_constants(
          static_cast<float>(lr), static_cast<float>(cfg.beta1), static_cast<float>(cfg.beta2),
          static_cast<float>(cfg.eps), s.decay[i] ? static_cast<float>(cfg.weight_decay) : 0.0f,
          grad_scale, opt_step);
      const TensorView& w = s.master->named[i].second;
      ParamBuffers b;
      b.n = w.numel();
      b.master = w.as<float>();
      b.grad = s.grads->named[i].second.as<float>();
      if (s.m) {
        b.m32 = s.m->named[i].second.as<float>();
        b.v32 = s.v->named[i].second.as<float>();
      }
      hybrid_update_param(isa, k, s.optim.mode, s.optim.params[i], b,
                          kernels::cpu::sr_key(s.optim.sr_seed, opt_step, i));
    }
    s.refresh_compute();
    o.applied = true;
    return o;
  }
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
  s.refresh_compute();
  o.applied = true;
  return o;
}

}  // namespace ferry::train
