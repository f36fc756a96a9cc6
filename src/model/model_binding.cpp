// SPDX-License-Identifier: Apache-2.0
#include "model/model_binding.h"

#include <fmt/format.h>

#include "model/arch/arch.h"

namespace ferry::model {

Result<DecoderGeometry> make_geometry(const ModelConfig& c) {
  if (c.mlp_bias) return unimplemented("model: {}: mlp_bias is not supported", c.model_type);
  if (c.clip_qkv > 0) return unimplemented("model: {}: clip_qkv is not supported", c.model_type);
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

// Visits every parameter of the model in checkpoint-name form with its expected shape, handing
// the caller a pointer to the slot (in a ModelTensors<View>) that should point at it.
template <typename View, typename Fn>
Status for_each_param(const ModelConfig& c, const DecoderGeometry& g, ModelTensors<View>& t,
                      Fn&& fn) {
  const arch::ArchDescription& desc = arch::get(c.arch);
  const std::int64_t C = g.hidden, V = g.vocab, HD = std::int64_t(g.heads) * g.head_dim,
                     GD = std::int64_t(g.kv_heads) * g.head_dim, D = g.head_dim, F = g.mlp_width,
                     Fe = g.expert_width, E = g.experts;
  FERRY_TRY(fn("model.embed_tokens.weight", std::vector<std::int64_t>{V, C}, &t.embed));
  t.layers.resize(g.layers);
  for (int l = 0; l < g.layers; ++l) {
    LayerTensors<View>& L = t.layers[l];
    const std::string p = fmt::format("model.layers.{}.", l);
    FERRY_TRY(fn(p + "input_layernorm.weight", std::vector<std::int64_t>{C}, &L.attn_norm));
    FERRY_TRY(fn(p + "self_attn.q_proj.weight", std::vector<std::int64_t>{HD, C}, &L.q));
    FERRY_TRY(fn(p + "self_attn.k_proj.weight", std::vector<std::int64_t>{GD, C}, &L.k));
    FERRY_TRY(fn(p + "self_attn.v_proj.weight", std::vector<std::int64_t>{GD, C}, &L.v));
    FERRY_TRY(fn(p + "self_attn.o_proj.weight", std::vector<std::int64_t>{C, HD}, &L.o));
    if (g.qkv_bias) {
      FERRY_TRY(fn(p + "self_attn.q_proj.bias", std::vector<std::int64_t>{HD}, &L.q_bias));
      FERRY_TRY(fn(p + "self_attn.k_proj.bias", std::vector<std::int64_t>{GD}, &L.k_bias));
      FERRY_TRY(fn(p + "self_attn.v_proj.bias", std::vector<std::int64_t>{GD}, &L.v_bias));
    }
    if (g.o_bias) {
      FERRY_TRY(fn(p + "self_attn.o_proj.bias", std::vector<std::int64_t>{C}, &L.o_bias));
    }
    if (g.qk_norm != QkNorm::kNone) {
      const bool per_head = g.qk_norm == QkNorm::kPerHead;
      FERRY_TRY(fn(p + "self_attn.q_norm.weight", std::vector<std::int64_t>{per_head ? D : HD},
                   &L.q_norm));
      FERRY_TRY(fn(p + "self_attn.k_norm.weight", std::vector<std::int64_t>{per_head ? D : GD},
                   &L.k_norm));
    }
    FERRY_TRY(fn(p + "post_attention_layernorm.weight", std::vector<std::int64_t>{C}, &L.mlp_norm));
    if (!g.layer_is_moe[l]) {
      FERRY_TRY(fn(p + "mlp.gate_proj.weight", std::vector<std::int64_t>{F, C}, &L.gate));
      FERRY_TRY(fn(p + "mlp.up_proj.weight", std::vector<std::int64_t>{F, C}, &L.up));
      FERRY_TRY(fn(p + "mlp.down_proj.weight", std::vector<std::int64_t>{C, F}, &L.down));
      continue;
    }
    const arch::MoeNames& n = desc.moe_names;
    const std::string block = p + std::string(n.block) + ".";
    FERRY_TRY(
        fn(block + std::string(n.router) + ".weight", std::vector<std::int64_t>{E, C}, &L.router));
    L.expert_gate.resize(E);
    L.expert_up.resize(E);
    L.expert_down.resize(E);
    for (std::int64_t e = 0; e < E; ++e) {
      const std::string ep = fmt::format("{}experts.{}.", block, e);
      FERRY_TRY(fn(ep + std::string(n.expert_gate) + ".weight", std::vector<std::int64_t>{Fe, C},
                   &L.expert_gate[e]));
      FERRY_TRY(fn(ep + std::string(n.expert_up) + ".weight", std::vector<std::int64_t>{Fe, C},
                   &L.expert_up[e]));
      FERRY_TRY(fn(ep + std::string(n.expert_down) + ".weight", std::vector<std::int64_t>{C, Fe},
                   &L.expert_down[e]));
    }
  }
  FERRY_TRY(fn("model.norm.weight", std::vector<std::int64_t>{C}, &t.final_norm));
  if (g.tied_embeddings) {
    t.lm_head = t.embed;
  } else {
    FERRY_TRY(fn("lm_head.weight", std::vector<std::int64_t>{V, C}, &t.lm_head));
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<LoadedModel>> load_model_f32(const std::string& dir) {
  auto m = std::make_unique<LoadedModel>();
  FERRY_ASSIGN_OR_RETURN(m->config, load_model_config(dir));
  FERRY_ASSIGN_OR_RETURN(m->geometry, make_geometry(m->config));
  FERRY_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir));
  m->checkpoint = std::make_unique<Checkpoint>(std::move(ckpt));
  // Count first so `owned` never reallocates while views point into it.
  std::size_t n_params = 0;
  ModelParams counting;
  FERRY_TRY(for_each_param(
      m->config, m->geometry, counting,
      [&](const std::string&, const std::vector<std::int64_t>&, ConstTensorView*) -> Status {
        ++n_params;
        return {};
      }));
  m->owned.reserve(n_params);
  LoadedModel* mp = m.get();
  FERRY_TRY(for_each_param(
      m->config, m->geometry, m->params,
      [&](const std::string& name, const std::vector<std::int64_t>& shape,
          ConstTensorView* slot) -> Status {
        FERRY_ASSIGN_OR_RETURN(const Checkpoint::Entry entry, mp->checkpoint->get(name));
        FERRY_TRY(check_tensor_shape(*entry.info, shape, entry.file->path()));
        if (!is_float(entry.info->dtype)) {
          return corrupt("model: tensor {} in {} has dtype {}, expected a float type", name,
                         entry.file->path(), to_string(entry.info->dtype));
        }
        FERRY_ASSIGN_OR_RETURN(ConstTensorView v, entry.file->view(*entry.info));
        if (v.dtype != DType::kF32 || !entry.file->aligned(*entry.info)) {
          std::vector<float>& buf = mp->owned.emplace_back(static_cast<std::size_t>(v.numel()));
          if (v.dtype == DType::kF32) {
            std::memcpy(buf.data(), v.data, buf.size() * sizeof(float));
          } else {
            convert_elements(v.data, v.dtype, buf.data(), DType::kF32, buf.size());
          }
          ConstTensorView owned_view = v;
          owned_view.data = buf.data();
          owned_view.dtype = DType::kF32;
          v = owned_view;
        }
        *slot = v;
        mp->named.emplace_back(name, v);
        return {};
      }));
  return m;
}

Result<std::unique_ptr<GradStorage>> GradStorage::create(const LoadedModel& model) {
  auto gs = std::make_unique<GradStorage>();
  gs->bufs.reserve(model.named.size());
  std::size_t i = 0;
  ModelGrads& grads = gs->grads;
  GradStorage* gp = gs.get();
  FERRY_TRY(for_each_param(
      model.config, model.geometry, grads,
      [&](const std::string& name, const std::vector<std::int64_t>& shape,
          TensorView* slot) -> Status {
        FERRY_CHECK(i < model.named.size() && model.named[i].first == name,
                    "model: gradient order diverged from parameter order at {}", name);
        ++i;
        std::vector<float>& buf = gp->bufs.emplace_back(
            static_cast<std::size_t>(model.named[i - 1].second.numel()), 0.0f);
        TensorView v = TensorView::contiguous(buf.data(), DType::kF32, Device::kCpu, {1});
        v.ndim = static_cast<int>(shape.size());
        std::int64_t stride = 1;
        for (int d = v.ndim - 1; d >= 0; --d) {
          v.shape[d] = shape[d];
          v.stride[d] = stride;
          stride *= shape[d];
        }
        *slot = v;
        gp->named.emplace_back(name, v);
        return {};
      }));
  return gs;
}

void GradStorage::zero() {
  for (auto& b : bufs) std::fill(b.begin(), b.end(), 0.0f);
}

}  // namespace ferry::model
