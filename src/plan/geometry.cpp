// SPDX-License-Identifier: Apache-2.0
// Values from the models' config.json on the Hugging Face hub (Qwen/Qwen2.5-*).
#include "plan/geometry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ferry::plan {
namespace {

struct Builtin {
  const char* name;
  const char* config_json;
};

constexpr Builtin kBuiltins[] = {
    {"qwen2.5-0.5b",
     R"({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
         "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
         "vocab_size": 151936, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
         "rope_theta": 1000000.0, "tie_word_embeddings": true, "use_sliding_window": false,
         "hidden_act": "silu", "torch_dtype": "bfloat16"})"},
    {"qwen2.5-1.5b",
     R"({"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
         "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
         "vocab_size": 151936, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
         "rope_theta": 1000000.0, "tie_word_embeddings": true, "use_sliding_window": false,
         "hidden_act": "silu", "torch_dtype": "bfloat16"})"},
    {"qwen2.5-3b",
     R"({"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008,
         "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
         "vocab_size": 151936, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
         "rope_theta": 1000000.0, "tie_word_embeddings": true, "use_sliding_window": false,
         "hidden_act": "silu", "torch_dtype": "bfloat16"})"},
    {"qwen2.5-7b",
     R"({"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
         "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
         "vocab_size": 152064, "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
         "rope_theta": 1000000.0, "tie_word_embeddings": false, "use_sliding_window": false,
         "hidden_act": "silu", "torch_dtype": "bfloat16"})"},
    {"qwen2.5-14b",
     R"({"model_type": "qwen2", "hidden_size": 5120, "intermediate_size": 13824,
         "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
         "vocab_size": 152064, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
         "rope_theta": 1000000.0, "tie_word_embeddings": false, "use_sliding_window": false,
         "hidden_act": "silu", "torch_dtype": "bfloat16"})"},
};

}  // namespace

std::vector<std::string> builtin_geometry_names() {
  std::vector<std::string> names;
  for (const Builtin& b : kBuiltins) names.emplace_back(b.name);
  return names;
}

Result<model::ModelConfig> builtin_geometry(std::string_view name) {
  for (const Builtin& b : kBuiltins) {
    if (name == b.name) return model::parse_model_config_text(b.config_json, b.name);
  }
  return not_found("plan: no built-in geometry \"{}\" (have: {})", name,
                   fmt::join(builtin_geometry_names(), ", "));
}

}  // namespace ferry::plan
