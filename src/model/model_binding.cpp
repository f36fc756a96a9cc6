// SPDX-License-Identifier: Apache-2.0
#include "model/model_binding.h"

#include <fmt/format.h>

#include "model/param_spec.h"

namespace ferry::model {

Result<DecoderGeometry> make_geometry(const ModelConfig& c) {
  if (c.mlp_bias) return unimplemented("model: {}: mlp_bias is not supported", c.model_type);
  if (c.clip_qkv > 0) return unimplemented("model: {}: clip_qkv is not supported", c.model_type);
  if (c.sliding_window > 0) {
    return unimplemented("model: {}: sliding-window attention ({} tokens) is not supported yet",
                         c.model_type, c.sliding_window);
  }
  if (c.hidden_act != "silu") {
    return unimplemented("model: {}: hidden_act '{}' is not supported (silu only)", c.model_type,
                         c.hidden_act);
  }
  DecoderGeometry g;
  g.vocab = static_cast<int>(c.vocab_size);
  g.hidden = static_cast<int>(c.hidden_size);
  g.layers = static_cast<int>(c.num_hidden_layers);
  g.heads = static_cast<int>(c.num_attention_heads);
  g.kv_heads = static_cast<int>(c.num_key_value_heads);
  g.head_dim = static_cast<int>(c.head_dim);
  g.mlp_width = static_cast<int>(c.intermediate_size);
  g.experts = static_cast<int>(c.num_experts);
  g.expert_width =
      static_cast<int>(c.moe_intermediate_size > 0 ? c.moe_intermediate_size : c.intermediate_size);
  g.top_k = static_cast<int>(c.num_experts_per_tok);
  g.renormalize_topk = c.router_norm == RouterNorm::kSoftmaxThenTopKRenormalize;
  g.rms_eps = static_cast<float>(c.rms_norm_eps);
  g.qk_norm = c.qk_norm;
  g.qkv_bias = c.qkv_bias;
  g.o_bias = c.o_bias;
  g.tied_embeddings = c.tie_word_embeddings;
  g.padding_idx = static_cast<int>(c.pad_token_id);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    g.layer_is_moe.push_back(c.is_moe_layer(l));
  FERRY_ASSIGN_OR_RETURN(
      g.rope, kernels::make_rope_table(c.rope, g.head_dim, c.max_position_embeddings, 0));
  return g;
}

namespace {

// The slot of `t` that parameter `spec` binds to (ParamSpec roles -> ModelTensors fields).
template <typename View>
View* slot_for(ModelTensors<View>& t, const ParamSpec& spec, const DecoderGeometry& g) {
  if (spec.layer < 0) {
    switch (spec.role) {
      case ParamRole::kEmbed:
        return &t.embed;
      case ParamRole::kFinalNorm:
        return &t.final_norm;
      case ParamRole::kLmHead:
        return &t.lm_head;
      default:
        FERRY_CHECK(false, "model: global parameter {} has a layer role", spec.hf_name);
    }
  }
  if (t.layers.size() != static_cast<std::size_t>(g.layers)) t.layers.resize(g.layers);
  LayerTensors<View>& L = t.layers[spec.layer];
  if (is_expert_role(spec.role) && L.expert_gate.size() != static_cast<std::size_t>(g.experts)) {
    L.expert_gate.resize(g.experts);
    L.expert_up.resize(g.experts);
    L.expert_down.resize(g.experts);
  }
  switch (spec.role) {
    case ParamRole::kAttnNorm:
      return &L.attn_norm;
    case ParamRole::kQProj:
      return &L.q;
    case ParamRole::kKProj:
      return &L.k;
    case ParamRole::kVProj:
      return &L.v;
    case ParamRole::kOProj:
      return &L.o;
    case ParamRole::kQBias:
      return &L.q_bias;
    case ParamRole::kKBias:
      return &L.k_bias;
    case ParamRole::kVBias:
      return &L.v_bias;
    case ParamRole::kOBias:
      return &L.o_bias;
    case ParamRole::kQNorm:
      return &L.q_norm;
    case ParamRole::kKNorm:
      return &L.k_norm;
    case ParamRole::kMlpNorm:
      return &L.mlp_norm;
    case ParamRole::kGate:
      return &L.gate;
    case ParamRole::kUp:
      return &L.up;
    case ParamRole::kDown:
      return &L.down;
    case ParamRole::kRouter:
      return &L.router;
    case ParamRole::kExpertGate:
      return &L.expert_gate[spec.expert];
    case ParamRole::kExpertUp:
      return &L.expert_up[spec.expert];
    case ParamRole::kExpertDown:
      return &L.expert_down[spec.expert];
    default:
      FERRY_CHECK(false, "model: layer parameter {} has a global role", spec.hf_name);
  }
  return nullptr;
}

}  // namespace

ConstTensorView* param_slot(ModelParams& params, const ParamSpec& spec, const DecoderGeometry& g) {
  return slot_for(params, spec, g);
}

Result<std::unique_ptr<LoadedModel>> load_model_f32(const std::string& dir) {
  auto m = std::make_unique<LoadedModel>();
  FERRY_ASSIGN_OR_RETURN(ModelWeights w, ModelWeights::load(dir, {.dtype = DType::kF32}));
  m->weights = std::make_unique<ModelWeights>(std::move(w));
  m->config = m->weights->config();
  FERRY_ASSIGN_OR_RETURN(m->geometry, make_geometry(m->config));
  m->params.layers.resize(m->geometry.layers);
  const auto& specs = m->weights->specs();
  const auto& views = m->weights->views();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    *slot_for(m->params, specs[i], m->geometry) = views[i];
    m->named.emplace_back(specs[i].hf_name, views[i]);
  }
  if (m->geometry.tied_embeddings) m->params.lm_head = m->params.embed;
  return m;
}

Result<std::unique_ptr<GradStorage>> GradStorage::create(const LoadedModel& model) {
  return create(model.weights->specs(), model.geometry);
}

Result<std::unique_ptr<GradStorage>> GradStorage::create(const std::vector<ParamSpec>& specs,
                                                         const DecoderGeometry& geometry) {
  auto gs = std::make_unique<GradStorage>();
  gs->bufs.reserve(specs.size());
  gs->grads.layers.resize(geometry.layers);
  for (const ParamSpec& spec : specs) {
    std::vector<float>& buf = gs->bufs.emplace_back(static_cast<std::size_t>(spec.numel()), 0.0f);
    TensorView v = TensorView::contiguous(buf.data(), DType::kF32, Device::kCpu, {1});
    v.ndim = static_cast<int>(spec.shape.size());
    std::int64_t stride = 1;
    for (int d = v.ndim - 1; d >= 0; --d) {
      v.shape[d] = spec.shape[d];
      v.stride[d] = stride;
      stride *= spec.shape[d];
    }
    *slot_for(gs->grads, spec, geometry) = v;
    gs->named.emplace_back(spec.hf_name, v);
  }
  if (geometry.tied_embeddings) gs->grads.lm_head = gs->grads.embed;
  return gs;
}

void GradStorage::zero() {
  for (auto& b : bufs) std::fill(b.begin(), b.end(), 0.0f);
}

}  // namespace ferry::model
