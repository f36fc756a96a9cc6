// SPDX-License-Identifier: Apache-2.0
// One ArchDescription per supported architecture (one .cpp each in this folder): its config.json
// defaults as transformers defines them, the traits that change the weight set (biases, q/k norm,
// MoE style) and the Hugging Face names of its MoE tensors. param_spec.cpp turns a description
// plus a ModelConfig into the canonical per-layer weight list; config.cpp uses the defaults.
// Adding an architecture = one new file here + one line in registry.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "model/config.h"

namespace ferry::model::arch {

struct ArchDefaults {
  std::int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  double rope_theta = 10000.0;
  std::int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
};

// Names of the MoE tensors inside "model.layers.N.<block>.".
struct MoeNames {
  std::string_view block;        // hub (4.x) block name: "mlp" or "block_sparse_moe"
  std::string_view router;       // "gate" -> <block>.gate.weight, [E, C]
  std::string_view expert_gate;  // per expert: <block>.experts.E.<name>.weight, [F, C]
  std::string_view expert_up;    // [F, C]
  std::string_view expert_down;  // [C, F]
  // transformers 5.x in-memory form (and checkpoints saved without the reverse conversion):
  // "<fused_block>.experts.gate_up_proj" [E, 2F, C] (gate rows first, then up) and
  // "<fused_block>.experts.down_proj" [E, C, F]; the router is "<fused_block>.gate.weight".
  std::string_view fused_block;
};

struct ArchDescription {
  Arch arch;
  std::string_view model_type;  // config.json "model_type"
  std::string_view hf_class;    // "LlamaForCausalLM"
  ArchDefaults defaults;
  bool qkv_bias_always = false;       // Qwen2: q/k/v biases regardless of config
  bool reads_attention_bias = false;  // "attention_bias" adds q/k/v AND o biases
  bool reads_mlp_bias = false;        // Llama "mlp_bias"
  QkNorm qk_norm = QkNorm::kNone;
  bool moe = false;
  MoeNames moe_names{};
  // Router top-k weights: fixed for this arch, or from "norm_topk_prob" with this default.
  bool router_norm_from_config = false;
  bool norm_topk_prob_default = false;
  bool expert_width_is_moe_intermediate = false;  // else intermediate_size
  bool reads_sparse_step = false;                 // decoder_sparse_step + mlp_only_layers
  bool reads_clip_qkv = false;                    // OLMoE
};

const ArchDescription& llama();
const ArchDescription& qwen2();
const ArchDescription& qwen3();
const ArchDescription& qwen3_moe();
const ArchDescription& mixtral();
const ArchDescription& olmoe();

// All descriptions, in a stable order.
std::span<const ArchDescription* const> all();
// nullptr when model_type is not supported.
const ArchDescription* find(std::string_view model_type);
const ArchDescription& get(Arch a);
// "llama, qwen2, qwen3, qwen3_moe, mixtral, olmoe"
std::string supported_model_types();

}  // namespace ferry::model::arch
