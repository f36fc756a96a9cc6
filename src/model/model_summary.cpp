// SPDX-License-Identifier: Apache-2.0
#include "model/model_summary.h"

#include <fmt/format.h>

#include "model/param_spec.h"

namespace ferry::model {

std::string rope_summary(const kernels::RopeScaling& r) {
  std::string s = fmt::format("{} (theta {:g}", to_string(r.type), r.theta);
  if (r.type != kernels::RopeType::kDefault) s += fmt::format(", factor {:g}", r.factor);
  if (r.type == kernels::RopeType::kLlama3) {
    s += fmt::format(", low {:g}, high {:g}", r.low_freq_factor, r.high_freq_factor);
  }
  if (r.original_max_position_embeddings > 0) {
    s += fmt::format(", original {}", r.original_max_position_embeddings);
  }
  if (r.partial_rotary_factor != 1.0) s += fmt::format(", partial {:g}", r.partial_rotary_factor);
  return s + ")";
}

ModelSummary summarize(const ModelConfig& config, const Checkpoint* checkpoint) {
  ModelSummary s;
  s.config = config;
  s.layers.resize(static_cast<std::size_t>(config.num_hidden_layers));
  for (std::size_t l = 0; l < s.layers.size(); ++l) {
    s.layers[l].layer = static_cast<int>(l);
    s.layers[l].moe = config.is_moe_layer(static_cast<std::int64_t>(l));
  }
  for (const ParamSpec& p : param_specs(config)) {
    const std::int64_t n = p.numel();
    s.total_params += n;
    if (p.layer < 0) {
      if (p.role == ParamRole::kEmbed || p.role == ParamRole::kLmHead) s.embedding_params += n;
      continue;
    }
    LayerSummary& L = s.layers[static_cast<std::size_t>(p.layer)];
    if (p.role == ParamRole::kAttnNorm || p.role == ParamRole::kMlpNorm) {
      L.norm_params += n;
    } else if (is_attention_role(p.role)) {
      L.attention_params += n;
    } else {
      L.mlp_params += n;
      if (is_expert_role(p.role) && p.expert == 0) L.expert_params += n;
    }
  }
  s.active_params = s.total_params;
  for (const LayerSummary& L : s.layers) {
    if (L.moe)
      s.active_params -= (config.num_experts - config.num_experts_per_tok) * L.expert_params;
  }
  if (checkpoint != nullptr) {
    s.checkpoint_shards = checkpoint->shards().size();
    for (const auto& shard : checkpoint->shards()) {
      for (const TensorInfo& t : shard->tensors()) {
        s.checkpoint_bytes_per_dtype[std::string(to_string(t.dtype))] += t.size_bytes();
        ++s.checkpoint_tensors;
      }
    }
  }
  return s;
}

Json to_json(const ModelSummary& s) {
  const ModelConfig& c = s.config;
  Json j;
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["intermediate_size"] = c.intermediate_size;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["qkv_bias"] = c.qkv_bias;
  j["qk_norm"] = std::string(to_string(c.qk_norm));
  j["rope"] = {{"type", std::string(to_string(c.rope.type))},
               {"theta", c.rope.theta},
               {"factor", c.rope.factor},
               {"summary", rope_summary(c.rope)}};
  if (c.is_moe()) {
    j["moe"] = {{"num_experts", c.num_experts},
                {"num_experts_per_tok", c.num_experts_per_tok},
                {"expert_intermediate_size", c.moe_intermediate_size},
                {"renormalize_topk", c.router_norm == RouterNorm::kSoftmaxThenTopKRenormalize}};
  }
  j["params"] = {{"total", s.total_params},
                 {"active_per_token", s.active_params},
                 {"embedding", s.embedding_params}};
  Json layers = Json::array();
  for (const LayerSummary& L : s.layers) {
    layers.push_back({{"layer", L.layer},
                      {"moe", L.moe},
                      {"attention_params", L.attention_params},
                      {"mlp_params", L.mlp_params},
                      {"expert_params", L.expert_params},
                      {"norm_params", L.norm_params}});
  }
  j["layers"] = std::move(layers);
  Json bytes = Json::object();
  for (const auto& [dt, b] : s.checkpoint_bytes_per_dtype) bytes[dt] = b;
  j["checkpoint"] = {{"shards", s.checkpoint_shards},
                     {"tensors", s.checkpoint_tensors},
                     {"bytes_per_dtype", std::move(bytes)}};
  return j;
}

namespace {
std::string human(std::int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{:.2f}B", static_cast<double>(n) / 1e9);
  if (n >= 1'000'000) return fmt::format("{:.2f}M", static_cast<double>(n) / 1e6);
  if (n >= 1'000) return fmt::format("{:.1f}K", static_cast<double>(n) / 1e3);
  return std::to_string(n);
}
}  // namespace

std::string to_text(const ModelSummary& s) {
  const ModelConfig& c = s.config;
  std::string out;
  out += fmt::format("architecture: {} ({} layers, C={}, H={}, Hkv={}, D={}, V={})\n", c.model_type,
                     c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
                     c.num_key_value_heads, c.head_dim, c.vocab_size);
  if (c.is_moe()) {
    out +=
        fmt::format("moe: {} experts, top-{}, expert F={}, top-k {}\n", c.num_experts,
                    c.num_experts_per_tok, c.moe_intermediate_size,
                    c.router_norm == RouterNorm::kSoftmaxThenTopKRenormalize ? "renormalised"
                                                                             : "not renormalised");
  }
  out += fmt::format("params: total {} ({}), active per token {} ({}), embeddings {}\n",
                     s.total_params, human(s.total_params), s.active_params, human(s.active_params),
                     human(s.embedding_params));
  out += fmt::format("tied embeddings: {}\n", c.tie_word_embeddings ? "yes" : "no");
  out += fmt::format("rope: {}\n", rope_summary(c.rope));
  out += fmt::format("attention: qkv bias {}, o bias {}, q/k norm {}\n", c.qkv_bias ? "yes" : "no",
                     c.o_bias ? "yes" : "no", to_string(c.qk_norm));
  if (s.checkpoint_shards > 0) {
    out += fmt::format("checkpoint: {} tensors in {} shard(s)", s.checkpoint_tensors,
                       s.checkpoint_shards);
    for (const auto& [dt, b] : s.checkpoint_bytes_per_dtype) {
      out += fmt::format(", {} {:.2f} MiB", dt, static_cast<double>(b) / (1 << 20));
    }
    out += "\n";
  }
  out += "layer  kind   attention        mlp/experts      norms\n";
  for (const LayerSummary& L : s.layers) {
    out += fmt::format("{:5}  {:5}  {:>15}  {:>15}  {:>6}\n", L.layer, L.moe ? "moe" : "dense",
                       L.attention_params, L.mlp_params, L.norm_params);
  }
  return out;
}

}  // namespace ferry::model
