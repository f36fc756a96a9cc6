// SPDX-License-Identifier: Apache-2.0
// config.json -> ModelConfig. Typed key readers produce "model: <file>: key <k> ..." errors; the
// architecture's description (arch/*.cpp) supplies the defaults and traits.
#include "model/config.h"

#include <algorithm>

#include "core/file_util.h"
#include "core/log.h"
#include "model/arch/arch.h"
#include "model/model_dir.h"

namespace ferry::model {
namespace {

// Absent or null -> nullopt; present with the wrong type -> error.
Result<std::optional<std::int64_t>> opt_int(const Json& j, const char* key, std::string_view what) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<std::int64_t>{};
  if (!it->is_number_integer()) {
    return invalid_argument("model: {}: key {} must be an integer, found {}", what, key,
                            it->dump());
  }
  return std::optional<std::int64_t>{it->get<std::int64_t>()};
}

Result<std::int64_t> req_int(const Json& j, const char* key, std::string_view what) {
  FERRY_ASSIGN_OR_RETURN(const auto v, opt_int(j, key, what));
  if (!v) return invalid_argument("model: {}: missing required key {}", what, key);
  return *v;
}

Result<std::int64_t> int_or(const Json& j, const char* key, std::int64_t def,
                            std::string_view what) {
  FERRY_ASSIGN_OR_RETURN(const auto v, opt_int(j, key, what));
  return v.value_or(def);
}

Result<bool> bool_or(const Json& j, const char* key, bool def, std::string_view what) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) {
    return invalid_argument("model: {}: key {} must be true or false, found {}", what, key,
                            it->dump());
  }
  return it->get<bool>();
}

Result<double> double_or(const Json& j, const char* key, double def, std::string_view what) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number()) {
    return invalid_argument("model: {}: key {} must be a number, found {}", what, key, it->dump());
  }
  return it->get<double>();
}

Result<std::string> string_or(const Json& j, const char* key, std::string def,
                              std::string_view what) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_string()) {
    return invalid_argument("model: {}: key {} must be a string, found {}", what, key, it->dump());
  }
  return it->get<std::string>();
}

// num_experts (4.x Qwen/OLMoE) or num_local_experts (Mixtral, 5.x Qwen3-MoE); both must agree.
Result<std::int64_t> expert_count(const Json& j, std::string_view what) {
  FERRY_ASSIGN_OR_RETURN(const auto a, opt_int(j, "num_experts", what));
  FERRY_ASSIGN_OR_RETURN(const auto b, opt_int(j, "num_local_experts", what));
  if (a && b && *a != *b) {
    return invalid_argument("model: {}: num_experts {} and num_local_experts {} disagree", what, *a,
                            *b);
  }
  if (!a && !b) {
    return invalid_argument("model: {}: missing required key num_experts (or num_local_experts)",
                            what);
  }
  return a ? *a : *b;
}

Status read_moe(const Json& j, const arch::ArchDescription& d, ModelConfig& c,
                std::string_view what) {
  FERRY_ASSIGN_OR_RETURN(c.num_experts, expert_count(j, what));
  FERRY_ASSIGN_OR_RETURN(c.num_experts_per_tok, req_int(j, "num_experts_per_tok", what));
  if (d.expert_width_is_moe_intermediate) {
    FERRY_ASSIGN_OR_RETURN(c.moe_intermediate_size, req_int(j, "moe_intermediate_size", what));
  } else {
    c.moe_intermediate_size = c.intermediate_size;
  }
  bool renorm = d.norm_topk_prob_default;
  if (d.router_norm_from_config) {
    FERRY_ASSIGN_OR_RETURN(renorm, bool_or(j, "norm_topk_prob", d.norm_topk_prob_default, what));
  }
  c.router_norm = renorm ? RouterNorm::kSoftmaxThenTopKRenormalize : RouterNorm::kSoftmaxThenTopK;
  if (d.reads_sparse_step) {
    FERRY_ASSIGN_OR_RETURN(c.decoder_sparse_step, int_or(j, "decoder_sparse_step", 1, what));
    if (const auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
      if (!it->is_array()) {
        return invalid_argument("model: {}: mlp_only_layers must be a list of layer indices", what);
      }
      for (const Json& l : *it) {
        if (!l.is_number_integer()) {
          return invalid_argument("model: {}: mlp_only_layers entry {} is not an integer", what,
                                  l.dump());
        }
        c.mlp_only_layers.push_back(l.get<std::int64_t>());
      }
    }
  }
  return {};
}

}  // namespace

std::string_view to_string(Arch a) { return arch::get(a).model_type; }

std::string_view to_string(QkNorm q) {
  switch (q) {
    case QkNorm::kNone:
      return "none";
    case QkNorm::kPerHead:
      return "per_head";
    case QkNorm::kFullWidth:
      return "full_width";
  }
  return "?";
}

bool ModelConfig::is_moe_layer(std::int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) {
    return false;
  }
  return decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0;
}

Status validate(const ModelConfig& c, std::string_view what) {
  const std::pair<const char*, std::int64_t> positive[] = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_position_embeddings}};
  for (const auto& [key, v] : positive) {
    if (v <= 0) return invalid_argument("model: {}: {} must be positive, found {}", what, key, v);
  }
  bool any_dense = false;
  for (std::int64_t l = 0; l < c.num_hidden_layers && !any_dense; ++l) {
    any_dense = !c.is_moe_layer(l);
  }
  if (any_dense && c.intermediate_size <= 0) {
    return invalid_argument("model: {}: intermediate_size must be positive, found {}", what,
                            c.intermediate_size);
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return invalid_argument(
        "model: {}: num_key_value_heads {} does not divide num_attention_heads {}", what,
        c.num_key_value_heads, c.num_attention_heads);
  }
  if (c.head_dim % 2 != 0) {
    return invalid_argument("model: {}: head_dim {} must be even for rotary embeddings", what,
                            c.head_dim);
  }
  if (!(c.rms_norm_eps > 0.0)) {
    return invalid_argument("model: {}: rms_norm_eps must be positive, found {}", what,
                            c.rms_norm_eps);
  }
  if (c.is_moe()) {
    if (c.num_experts_per_tok <= 0) {
      return invalid_argument("model: {}: num_experts_per_tok must be positive, found {}", what,
                              c.num_experts_per_tok);
    }
    if (c.num_experts_per_tok > c.num_experts) {
      return invalid_argument("model: {}: num_experts_per_tok {} exceeds the {} experts", what,
                              c.num_experts_per_tok, c.num_experts);
    }
    if (c.moe_intermediate_size <= 0) {
      return invalid_argument("model: {}: expert intermediate size must be positive, found {}",
                              what, c.moe_intermediate_size);
    }
    if (c.decoder_sparse_step <= 0) {
      return invalid_argument("model: {}: decoder_sparse_step must be positive, found {}", what,
                              c.decoder_sparse_step);
    }
    for (std::int64_t l : c.mlp_only_layers) {
      if (l < 0 || l >= c.num_hidden_layers) {
        return invalid_argument("model: {}: mlp_only_layers entry {} is not a layer in [0, {})",
                                what, l, c.num_hidden_layers);
      }
    }
  }
  return {};
}

Result<ModelConfig> parse_model_config(const Json& j, std::string_view what) {
  if (!j.is_object()) return invalid_argument("model: {}: config is not a JSON object", what);
  const auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) {
    return invalid_argument("model: {}: missing model_type (supported: {})", what,
                            arch::supported_model_types());
  }
  const arch::ArchDescription* d = arch::find(mt->get<std::string>());
  if (d == nullptr) {
    return unimplemented("model: {}: unsupported model_type \"{}\" (supported: {})", what,
                         mt->get<std::string>(), arch::supported_model_types());
  }
  ModelConfig c;
  c.arch = d->arch;
  c.model_type = std::string(d->model_type);
  FERRY_ASSIGN_OR_RETURN(c.vocab_size, req_int(j, "vocab_size", what));
  FERRY_ASSIGN_OR_RETURN(c.hidden_size, req_int(j, "hidden_size", what));
  FERRY_ASSIGN_OR_RETURN(c.num_hidden_layers, req_int(j, "num_hidden_layers", what));
  FERRY_ASSIGN_OR_RETURN(c.num_attention_heads, req_int(j, "num_attention_heads", what));
  // Qwen3-MoE with every layer sparse never uses intermediate_size; all others need it.
  if (d->expert_width_is_moe_intermediate) {
    FERRY_ASSIGN_OR_RETURN(c.intermediate_size, int_or(j, "intermediate_size", 0, what));
  } else {
    FERRY_ASSIGN_OR_RETURN(c.intermediate_size, req_int(j, "intermediate_size", what));
  }
  FERRY_ASSIGN_OR_RETURN(c.num_key_value_heads,
                         int_or(j, "num_key_value_heads", c.num_attention_heads, what));
  FERRY_ASSIGN_OR_RETURN(const auto head_dim, opt_int(j, "head_dim", what));
  if (head_dim) {
    c.head_dim = *head_dim;
  } else if (d->defaults.head_dim > 0) {
    c.head_dim = d->defaults.head_dim;
  } else {
    if (c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads != 0) {
      return invalid_argument(
          "model: {}: num_attention_heads {} does not divide hidden_size {} (and no head_dim "
          "given)",
          what, c.num_attention_heads, c.hidden_size);
    }
    c.head_dim = c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0;
  }
  FERRY_ASSIGN_OR_RETURN(
      c.max_position_embeddings,
      int_or(j, "max_position_embeddings", d->defaults.max_position_embeddings, what));
  FERRY_ASSIGN_OR_RETURN(c.rms_norm_eps,
                         double_or(j, "rms_norm_eps", d->defaults.rms_norm_eps, what));
  FERRY_ASSIGN_OR_RETURN(c.tie_word_embeddings,
                         bool_or(j, "tie_word_embeddings", d->defaults.tie_word_embeddings, what));
  bool attention_bias = false;
  if (d->reads_attention_bias) {
    FERRY_ASSIGN_OR_RETURN(attention_bias, bool_or(j, "attention_bias", false, what));
  }
  c.qkv_bias = d->qkv_bias_always || attention_bias;
  c.o_bias = attention_bias;
  if (d->reads_mlp_bias) {
    FERRY_ASSIGN_OR_RETURN(c.mlp_bias, bool_or(j, "mlp_bias", false, what));
  }
  c.qk_norm = d->qk_norm;
  if (d->reads_clip_qkv) {
    FERRY_ASSIGN_OR_RETURN(c.clip_qkv, double_or(j, "clip_qkv", 0.0, what));
  }
  FERRY_ASSIGN_OR_RETURN(c.hidden_act, string_or(j, "hidden_act", "silu", what));
  // The embedding's padding_idx in transformers: that row never receives a gradient.
  FERRY_ASSIGN_OR_RETURN(const auto pad_token_id, opt_int(j, "pad_token_id", what));
  c.pad_token_id = pad_token_id ? *pad_token_id : -1;
  FERRY_ASSIGN_OR_RETURN(c.dtype, string_or(j, "dtype", "", what));
  if (c.dtype.empty()) {
    FERRY_ASSIGN_OR_RETURN(c.dtype, string_or(j, "torch_dtype", "", what));
  }

  FERRY_ASSIGN_OR_RETURN(const bool use_sw, bool_or(j, "use_sliding_window", true, what));
  FERRY_ASSIGN_OR_RETURN(const auto sw, opt_int(j, "sliding_window", what));
  if (sw && use_sw && *sw > 0) {
    c.sliding_window = *sw;
    log::get("model")->warn("config={} sliding_window={} is set; attention must honour it", what,
                            *sw);
  }

  FERRY_ASSIGN_OR_RETURN(c.rope, parse_rope(j, d->defaults.rope_theta, what));
  if ((c.rope.type == kernels::RopeType::kYarn || c.rope.type == kernels::RopeType::kDynamic) &&
      c.rope.original_max_position_embeddings == 0) {
    c.rope.original_max_position_embeddings = c.max_position_embeddings;
  }
  if (d->moe) FERRY_TRY(read_moe(j, *d, c, what));

  if (c.hidden_act != "silu") {
    return unimplemented("model: {}: hidden_act \"{}\" is not supported (only silu)", what,
                         c.hidden_act);
  }
  if (c.mlp_bias) {
    return unimplemented("model: {}: mlp_bias true is not supported", what);
  }
  FERRY_TRY(validate(c, what));
  return c;
}

Result<ModelConfig> parse_model_config_text(std::string_view text, std::string_view what) {
  FERRY_ASSIGN_OR_RETURN(const Json j, parse_json(text, what));
  return parse_model_config(j, what);
}

Result<ModelConfig> load_model_config(const std::string& dir) {
  const std::string path = config_path(dir);
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  return parse_model_config_text(text, path);
}

}  // namespace ferry::model
