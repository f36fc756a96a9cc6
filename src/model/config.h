// SPDX-License-Identifier: Apache-2.0
// ModelConfig: the subset of a Hugging Face config.json that fixes a decoder-only LLM's weights
// and compute, for the six supported architectures (Llama, Qwen2/2.5, Qwen3, Qwen3-MoE, Mixtral,
// OLMoE). Both the transformers 4.x spelling (rope_theta + rope_scaling, num_experts /
// num_local_experts) and the 5.x spelling (rope_parameters, possibly nested per attention type)
// are accepted; the per-architecture defaults are transformers' (src/model/arch/*.cpp).
// NOTE(model): keys that fix tensor shapes (vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, and for MoE the expert count, top-k and expert width)
// are REQUIRED even though transformers would default them: a silently defaulted 4096 turns a
// typo into a confusing shape error far away. Everything else defaults like transformers.
// Tests: tests/unit/model/config_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "kernels/rope_table.h"

namespace ferry::model {

enum class Arch : std::uint8_t { kLlama, kQwen2, kQwen3, kQwen3Moe, kMixtral, kOlmoe };

// How q/k are normalised after projection (before RoPE).
enum class QkNorm : std::uint8_t {
  kNone,
  kPerHead,    // Qwen3 / Qwen3-MoE: RMSNorm over each head's D values, weight [D]
  kFullWidth,  // OLMoE: RMSNorm over the whole projection, weights [H*D] and [Hkv*D]
};

// How the router's top-k weights are formed.
enum class RouterNorm : std::uint8_t {
  kSoftmaxThenTopK,             // softmax over all E, keep top-k probabilities as they are
  kSoftmaxThenTopKRenormalize,  // ... then divide by their sum (== softmax over the top-k logits)
};

std::string_view to_string(Arch a);
std::string_view to_string(QkNorm q);

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string model_type;  // as in config.json ("llama", "qwen3_moe", ...)

  std::int64_t vocab_size = 0;               // V
  std::int64_t hidden_size = 0;              // C
  std::int64_t intermediate_size = 0;        // F of dense MLPs (Mixtral/OLMoE: of each expert)
  std::int64_t num_hidden_layers = 0;        // L
  std::int64_t num_attention_heads = 0;      // H
  std::int64_t num_key_value_heads = 0;      // Hkv (GQA); H when absent
  std::int64_t head_dim = 0;                 // D
  std::int64_t max_position_embeddings = 0;  // for rope tables and dynamic scaling
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;  // lm_head = embed_tokens, no lm_head tensor
  bool qkv_bias = false;             // q/k/v projections carry a bias
  bool o_bias = false;               // o_proj carries a bias (Llama/Qwen3/OLMoE attention_bias)
  bool mlp_bias = false;             // Llama mlp_bias: gate/up/down carry biases (unsupported)
  QkNorm qk_norm = QkNorm::kNone;
  double clip_qkv = 0.0;  // OLMoE: clamp q/k/v to [-clip, clip]; 0 = off
  std::string hidden_act = "silu";
  std::int64_t pad_token_id = -1;   // -1 = none; the embedding row that gets no gradient
  std::string dtype;                // "dtype" (5.x) or "torch_dtype" (4.x); may be empty
  std::int64_t sliding_window = 0;  // > 0 only when the config enables it; compute must honour
  kernels::RopeScaling rope;

  // Mixture of experts (num_experts == 0: dense).
  std::int64_t num_experts = 0;            // E
  std::int64_t num_experts_per_tok = 0;    // K
  std::int64_t moe_intermediate_size = 0;  // F of each expert
  RouterNorm router_norm = RouterNorm::kSoftmaxThenTopK;
  std::int64_t decoder_sparse_step = 1;       // Qwen3-MoE: layer l is MoE iff (l+1) % step == 0 ...
  std::vector<std::int64_t> mlp_only_layers;  // ... and l is not listed here

  bool is_moe() const { return num_experts > 0; }
  bool is_moe_layer(std::int64_t layer) const;
  std::int64_t q_dim() const { return num_attention_heads * head_dim; }   // H*D
  std::int64_t kv_dim() const { return num_key_value_heads * head_dim; }  // Hkv*D
};

// Parses a config.json document. `what` names it in errors (usually its path).
Result<ModelConfig> parse_model_config(const Json& j, std::string_view what);
Result<ModelConfig> parse_model_config_text(std::string_view text, std::string_view what);
// Reads <dir>/config.json.
Result<ModelConfig> load_model_config(const std::string& dir);

// The rope section alone: rope_parameters (5.x) or rope_theta + rope_scaling (4.x), plus
// partial_rotary_factor. `default_theta` is the architecture's rope_theta default.
Result<kernels::RopeScaling> parse_rope(const Json& j, double default_theta, std::string_view what);
std::string_view to_string(kernels::RopeType t);

// Checks sizes and divisibility; parse_model_config calls it, so call it only after editing.
Status validate(const ModelConfig& c, std::string_view what);

}  // namespace ferry::model
