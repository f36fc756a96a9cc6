// SPDX-License-Identifier: Apache-2.0
// The weight layout of a model: one ParamSpec per tensor, in a canonical layer-contiguous order
//   embed, layer 0 { attn_norm, q, [q_bias], k, [k_bias], v, [v_bias], [q_norm, k_norm], o,
//   [o_bias], mlp_norm, gate, up, down | router, expert 0 {gate, up, down}, expert 1 ... },
//   layer 1 ..., final_norm, [lm_head]
// so a layer's weights form one contiguous run (what the trainer's streamer and the expert pager
// slice). Shapes are Hugging Face's: a Linear weight is [out, in], row-major.
// Tied embeddings (tie_word_embeddings) have no lm_head spec: the LM head reuses embed.
// Tests: tests/unit/model/param_spec_test.cpp (counts vs the closed-form formula and vs the
// parameter counts transformers reported for tests/data/models/*).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"

namespace ferry::model {

enum class ParamRole : std::uint8_t {
  kEmbed,       // model.embed_tokens.weight   [V, C]
  kFinalNorm,   // model.norm.weight           [C]
  kLmHead,      // lm_head.weight              [V, C]
  kAttnNorm,    // input_layernorm.weight      [C]
  kQProj,       // self_attn.q_proj.weight     [H*D, C]
  kKProj,       // self_attn.k_proj.weight     [Hkv*D, C]
  kVProj,       // self_attn.v_proj.weight     [Hkv*D, C]
  kOProj,       // self_attn.o_proj.weight     [C, H*D]
  kQBias,       // self_attn.q_proj.bias       [H*D]
  kKBias,       // self_attn.k_proj.bias       [Hkv*D]
  kVBias,       // self_attn.v_proj.bias       [Hkv*D]
  kOBias,       // self_attn.o_proj.bias       [C]
  kQNorm,       // self_attn.q_norm.weight     [D] per head, or [H*D] full width (OLMoE)
  kKNorm,       // self_attn.k_norm.weight     [D] per head, or [Hkv*D] full width (OLMoE)
  kMlpNorm,     // post_attention_layernorm.weight [C]
  kGate,        // mlp.gate_proj.weight        [F, C]
  kUp,          // mlp.up_proj.weight          [F, C]
  kDown,        // mlp.down_proj.weight        [C, F]
  kRouter,      // mlp.gate.weight             [E, C]
  kExpertGate,  // experts.E.gate_proj.weight  [Fe, C]
  kExpertUp,    // experts.E.up_proj.weight    [Fe, C]
  kExpertDown,  // experts.E.down_proj.weight  [C, Fe]
};
inline constexpr int kNumParamRoles = 22;

std::string_view to_string(ParamRole r);
// Attention weights (projections, biases, q/k norms); norms; dense MLP; router; experts.
bool is_attention_role(ParamRole r);
bool is_norm_role(ParamRole r);  // attn_norm, mlp_norm, final_norm, q_norm, k_norm
bool is_expert_role(ParamRole r);

struct ParamSpec {
  std::string hf_name;  // hub (transformers 4.x) name, e.g. "model.layers.3.mlp.gate_proj.weight"
  ParamRole role = ParamRole::kEmbed;
  int layer = -1;   // -1 for embed / final_norm / lm_head
  int expert = -1;  // -1 unless an expert weight
  std::vector<std::int64_t> shape;

  std::int64_t numel() const;
};

// Every weight tensor of the model described by `c`, in canonical order.
std::vector<ParamSpec> param_specs(const ModelConfig& c);

// Hub name prefix of layer l: "model.layers.<l>."
std::string layer_prefix(int layer);

}  // namespace ferry::model
