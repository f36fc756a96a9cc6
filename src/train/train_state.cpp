// SPDX-License-Identifier: Apache-2.0
#include "train/train_state.h"

#include <cstring>

#include "core/dtype.h"
#include "model/param_spec.h"

namespace ferry::train {

model::ModelParams as_params(const model::ModelGrads& g) {
  model::ModelParams p;
  p.embed = g.embed;
  p.final_norm = g.final_norm;
  p.lm_head = g.lm_head;
  for (const auto& l : g.layers) p.layers.push_back(model::as_const(l));
  return p;
}

bool decays(const std::string& name) {
  if (name.find("norm") != std::string::npos) return false;
  const std::string_view bias = ".bias";
  return !(name.size() >= bias.size() &&
           name.compare(name.size() - bias.size(), bias.size(), bias.data()) == 0);
}

std::int64_t TrainState::num_elements() const {
  std::int64_t n = 0;
  for (const auto& [name, v] : master->named) n += v.numel();
  return n;
}

Result<std::unique_ptr<TrainState>> TrainState::from_loaded(const model::LoadedModel& loaded,
                                                            const OptimMode& mode,
                                                            std::uint64_t sr_seed,
                                                            const std::vector<bool>& q8) {
  auto s = std::make_unique<TrainState>();
  s->config = loaded.config;
  s->geometry = loaded.geometry;
  FERRY_ASSIGN_OR_RETURN(s->master, model::GradStorage::create(loaded));
  FERRY_ASSIGN_OR_RETURN(s->grads, model::GradStorage::create(loaded));
  for (std::size_t i = 0; i < loaded.named.size(); ++i) {
    const ConstTensorView& src = loaded.named[i].second;
    FERRY_CHECK(src.dtype == DType::kF32 && src.is_contiguous(),
                "train: loaded tensor {} is not contiguous f32", loaded.named[i].first);
    std::memcpy(s->master->named[i].second.data, src.data, src.bytes());
    s->decay.push_back(decays(loaded.named[i].first));
  }
  if (!q8.empty() && q8.size() != loaded.named.size()) {
    return invalid_argument("train: 8-bit selection of {} for {} parameters", q8.size(),
                            loaded.named.size());
  }
  s->optim = HybridOptimState::create(mode, sr_seed, *s->master, q8);
  if (s->optim.any_f32_states()) {
    FERRY_ASSIGN_OR_RETURN(s->m, model::GradStorage::create(loaded));
    FERRY_ASSIGN_OR_RETURN(s->v, model::GradStorage::create(loaded));
  }
  s->params = as_params(s->master->grads);
  return s;
}

Status TrainState::use_bf16_compute() {
  if (optim.mode.master != MasterWeights::kF32 || compute) return {};
  FERRY_ASSIGN_OR_RETURN(compute, model::GradStorage::create(model::param_specs(config), geometry));
  if (compute->named.size() != master->named.size()) {
    return internal_error("train: compute copy of {} tensors for {}", compute->named.size(),
                          master->named.size());
  }
  params = as_params(compute->grads);
  refresh_compute();
  return {};
}

void TrainState::round_grads_to_bf16() {
  if (!bf16_grads) return;
  for (auto& [name, t] : grads->named) {
    float* g = t.as<float>();
    const std::int64_t n = t.numel();
    for (std::int64_t k = 0; k < n; ++k) g[k] = bf16_to_f32(f32_to_bf16(g[k]));
  }
}

void TrainState::refresh_compute() {
  if (!compute) return;
  for (std::size_t i = 0; i < master->named.size(); ++i) {
    const float* m = master->named[i].second.as<float>();
    float* c = compute->named[i].second.as<float>();
    const std::int64_t n = master->named[i].second.numel();
    for (std::int64_t k = 0; k < n; ++k) c[k] = bf16_to_f32(f32_to_bf16(m[k]));
  }
}

}  // namespace ferry::train
