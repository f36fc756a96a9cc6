// SPDX-License-Identifier: Apache-2.0
// ModelConfig + ArchDescription -> canonical ParamSpec list. Names and traits come from the
// architecture's description (arch/*.cpp); this file only fixes the order and the shapes.
#include "model/param_spec.h"

#include <fmt/format.h>

#include "model/arch/arch.h"

namespace ferry::model {
namespace {

class SpecBuilder {
 public:
  explicit SpecBuilder(std::vector<ParamSpec>& out) : out_(out) {}
  void add(std::string name, ParamRole role, int layer, int expert,
           std::vector<std::int64_t> shape) {
    out_.push_back({std::move(name), role, layer, expert, std::move(shape)});
  }

 private:
  std::vector<ParamSpec>& out_;
};

void add_attention(const ModelConfig& c, int l, SpecBuilder& b) {
  const std::string p = layer_prefix(l) + "self_attn.";
  const std::int64_t C = c.hidden_size, Dq = c.q_dim(), Dkv = c.kv_dim();
  b.add(p + "q_proj.weight", ParamRole::kQProj, l, -1, {Dq, C});
  if (c.qkv_bias) b.add(p + "q_proj.bias", ParamRole::kQBias, l, -1, {Dq});
  b.add(p + "k_proj.weight", ParamRole::kKProj, l, -1, {Dkv, C});
  if (c.qkv_bias) b.add(p + "k_proj.bias", ParamRole::kKBias, l, -1, {Dkv});
  b.add(p + "v_proj.weight", ParamRole::kVProj, l, -1, {Dkv, C});
  if (c.qkv_bias) b.add(p + "v_proj.bias", ParamRole::kVBias, l, -1, {Dkv});
  if (c.qk_norm == QkNorm::kPerHead) {
    b.add(p + "q_norm.weight", ParamRole::kQNorm, l, -1, {c.head_dim});
    b.add(p + "k_norm.weight", ParamRole::kKNorm, l, -1, {c.head_dim});
  } else if (c.qk_norm == QkNorm::kFullWidth) {
    b.add(p + "q_norm.weight", ParamRole::kQNorm, l, -1, {Dq});
    b.add(p + "k_norm.weight", ParamRole::kKNorm, l, -1, {Dkv});
  }
  b.add(p + "o_proj.weight", ParamRole::kOProj, l, -1, {C, Dq});
  if (c.o_bias) b.add(p + "o_proj.bias", ParamRole::kOBias, l, -1, {C});
}

void add_dense_mlp(const ModelConfig& c, int l, SpecBuilder& b) {
  const std::string p = layer_prefix(l) + "mlp.";
  const std::int64_t C = c.hidden_size, F = c.intermediate_size;
  b.add(p + "gate_proj.weight", ParamRole::kGate, l, -1, {F, C});
  b.add(p + "up_proj.weight", ParamRole::kUp, l, -1, {F, C});
  b.add(p + "down_proj.weight", ParamRole::kDown, l, -1, {C, F});
}

void add_moe(const ModelConfig& c, const arch::MoeNames& n, int l, SpecBuilder& b) {
  const std::string p = fmt::format("{}{}.", layer_prefix(l), n.block);
  const std::int64_t C = c.hidden_size, F = c.moe_intermediate_size;
  b.add(fmt::format("{}{}.weight", p, n.router), ParamRole::kRouter, l, -1, {c.num_experts, C});
  for (int e = 0; e < static_cast<int>(c.num_experts); ++e) {
    const std::string ep = fmt::format("{}experts.{}.", p, e);
    b.add(fmt::format("{}{}.weight", ep, n.expert_gate), ParamRole::kExpertGate, l, e, {F, C});
    b.add(fmt::format("{}{}.weight", ep, n.expert_up), ParamRole::kExpertUp, l, e, {F, C});
    b.add(fmt::format("{}{}.weight", ep, n.expert_down), ParamRole::kExpertDown, l, e, {C, F});
  }
}

}  // namespace

std::string_view to_string(ParamRole r) {
  static constexpr std::string_view kNames[kNumParamRoles] = {
      "embed",  "final_norm",  "lm_head",   "attn_norm",  "q_proj", "k_proj",
      "v_proj", "o_proj",      "q_bias",    "k_bias",     "v_bias", "o_bias",
      "q_norm", "k_norm",      "mlp_norm",  "gate",       "up",     "down",
      "router", "expert_gate", "expert_up", "expert_down"};
  const auto i = static_cast<std::size_t>(r);
  return i < kNumParamRoles ? kNames[i] : "?";
}

bool is_attention_role(ParamRole r) { return r >= ParamRole::kQProj && r <= ParamRole::kKNorm; }
bool is_norm_role(ParamRole r) {
  return r == ParamRole::kAttnNorm || r == ParamRole::kMlpNorm || r == ParamRole::kFinalNorm ||
         r == ParamRole::kQNorm || r == ParamRole::kKNorm;
}
bool is_expert_role(ParamRole r) { return r >= ParamRole::kExpertGate; }

std::int64_t ParamSpec::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::string layer_prefix(int layer) { return fmt::format("model.layers.{}.", layer); }

std::vector<ParamSpec> param_specs(const ModelConfig& c) {
  const arch::ArchDescription& d = arch::get(c.arch);
  std::vector<ParamSpec> out;
  SpecBuilder b(out);
  const std::int64_t V = c.vocab_size, C = c.hidden_size;
  b.add("model.embed_tokens.weight", ParamRole::kEmbed, -1, -1, {V, C});
  for (int l = 0; l < static_cast<int>(c.num_hidden_layers); ++l) {
    b.add(layer_prefix(l) + "input_layernorm.weight", ParamRole::kAttnNorm, l, -1, {C});
    add_attention(c, l, b);
    b.add(layer_prefix(l) + "post_attention_layernorm.weight", ParamRole::kMlpNorm, l, -1, {C});
    if (c.is_moe_layer(l)) {
      add_moe(c, d.moe_names, l, b);
    } else {
      add_dense_mlp(c, l, b);
    }
  }
  b.add("model.norm.weight", ParamRole::kFinalNorm, -1, -1, {C});
  if (!c.tie_word_embeddings) b.add("lm_head.weight", ParamRole::kLmHead, -1, -1, {V, C});
  return out;
}

}  // namespace ferry::model
