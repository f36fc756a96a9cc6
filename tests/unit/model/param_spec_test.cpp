// SPDX-License-Identifier: Apache-2.0
// param_specs: counts and element totals against the closed-form formula per architecture, and
// against the parameter counts transformers 5.17 reported for the fixtures in tests/data/models
// (tests/data/models/fixtures.log: "params=...").
#include "model/param_spec.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace ferry::model {
namespace {

ModelConfig parse_ok(const std::string& text) {
  auto c = parse_model_config_text(text, "cfg");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? *c : ModelConfig{};
}

std::int64_t total_numel(const std::vector<ParamSpec>& specs) {
  std::int64_t n = 0;
  for (const ParamSpec& s : specs) n += s.numel();
  return n;
}

// Closed form: embed + L * (norms + attention + mlp) + final norm + untied head.
struct Formula {
  std::int64_t tensors = 0, params = 0;
};
Formula formula(const ModelConfig& c) {
  const std::int64_t V = c.vocab_size, C = c.hidden_size, Dq = c.q_dim(), Dkv = c.kv_dim();
  Formula f;
  f.tensors = 2 + (c.tie_word_embeddings ? 0 : 1);
  f.params = V * C + C + (c.tie_word_embeddings ? 0 : V * C);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    f.tensors += 2 + 4;  // two norms, q/k/v/o
    f.params += 2 * C + C * Dq + 2 * C * Dkv + Dq * C;
    if (c.qkv_bias) f.tensors += 3, f.params += Dq + 2 * Dkv;
    if (c.o_bias) f.tensors += 1, f.params += C;
    if (c.qk_norm == QkNorm::kPerHead) f.tensors += 2, f.params += 2 * c.head_dim;
    if (c.qk_norm == QkNorm::kFullWidth) f.tensors += 2, f.params += Dq + Dkv;
    if (c.is_moe_layer(l)) {
      f.tensors += 1 + 3 * c.num_experts;
      f.params += c.num_experts * C + c.num_experts * 3 * C * c.moe_intermediate_size;
    } else {
      f.tensors += 3;
      f.params += 3 * C * c.intermediate_size;
    }
  }
  return f;
}

const char* kConfigs[] = {
    R"({"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 160,
        "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2})",
    R"({"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 160,
        "num_hidden_layers": 2, "num_attention_heads": 8, "attention_bias": true,
        "tie_word_embeddings": true})",
    R"({"model_type": "qwen2", "vocab_size": 1000, "hidden_size": 96, "intermediate_size": 200,
        "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
        "tie_word_embeddings": true})",
    R"({"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32})",
    R"({"model_type": "qwen3_moe", "vocab_size": 500, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
        "decoder_sparse_step": 2, "mlp_only_layers": [3]})",
    R"({"model_type": "mixtral", "vocab_size": 500, "hidden_size": 64, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_local_experts": 4, "num_experts_per_tok": 2})",
    R"({"model_type": "olmoe", "vocab_size": 500, "hidden_size": 64, "intermediate_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_experts": 8, "num_experts_per_tok": 2})",
};

TEST(ParamSpec, CountsMatchFormulaForEveryArch) {
  std::set<Arch> seen;
  for (const char* text : kConfigs) {
    const ModelConfig c = parse_ok(text);
    seen.insert(c.arch);
    const auto specs = param_specs(c);
    const Formula f = formula(c);
    EXPECT_EQ(static_cast<std::int64_t>(specs.size()), f.tensors) << c.model_type;
    EXPECT_EQ(total_numel(specs), f.params) << c.model_type;
    std::set<std::string> names;
    for (const ParamSpec& s : specs) {
      EXPECT_TRUE(names.insert(s.hf_name).second) << "duplicate " << s.hf_name;
    }
  }
  EXPECT_EQ(seen.size(), 6u);
}

TEST(ParamSpec, LayerContiguousOrder) {
  const ModelConfig c = parse_ok(kConfigs[4]);
  const auto specs = param_specs(c);
  ASSERT_FALSE(specs.empty());
  EXPECT_EQ(specs.front().role, ParamRole::kEmbed);
  EXPECT_EQ(specs.back().role, ParamRole::kLmHead);
  int last_layer = -1;
  bool globals_done = false;
  for (std::size_t i = 1; i + 2 < specs.size(); ++i) {
    EXPECT_GE(specs[i].layer, last_layer) << specs[i].hf_name;
    last_layer = specs[i].layer;
    globals_done = true;
  }
  EXPECT_TRUE(globals_done);
  EXPECT_EQ(specs[specs.size() - 2].role, ParamRole::kFinalNorm);
}

TEST(ParamSpec, HubNamesAndShapes) {
  std::map<std::string, ParamSpec> by_name;
  for (const ParamSpec& s : param_specs(parse_ok(kConfigs[5]))) by_name[s.hf_name] = s;  // mixtral
  ASSERT_TRUE(by_name.count("model.layers.1.block_sparse_moe.gate.weight"));
  EXPECT_EQ(by_name["model.layers.1.block_sparse_moe.gate.weight"].role, ParamRole::kRouter);
  const ParamSpec& w1 = by_name["model.layers.0.block_sparse_moe.experts.3.w1.weight"];
  EXPECT_EQ(w1.role, ParamRole::kExpertGate);
  EXPECT_EQ(w1.expert, 3);
  EXPECT_EQ(w1.shape, (std::vector<std::int64_t>{48, 64}));
  EXPECT_EQ(by_name["model.layers.0.block_sparse_moe.experts.3.w3.weight"].role,
            ParamRole::kExpertUp);
  EXPECT_EQ(by_name["model.layers.0.block_sparse_moe.experts.3.w2.weight"].shape,
            (std::vector<std::int64_t>{64, 48}));

  by_name.clear();
  for (const ParamSpec& s : param_specs(parse_ok(kConfigs[6]))) by_name[s.hf_name] = s;  // olmoe
  EXPECT_EQ(by_name["model.layers.0.self_attn.q_norm.weight"].shape,
            (std::vector<std::int64_t>{64}));  // H*D = 4*16
  EXPECT_EQ(by_name["model.layers.0.self_attn.k_norm.weight"].shape,
            (std::vector<std::int64_t>{32}));  // Hkv*D = 2*16
  EXPECT_EQ(by_name["model.layers.1.mlp.experts.7.down_proj.weight"].role, ParamRole::kExpertDown);
  EXPECT_EQ(by_name["model.layers.1.mlp.gate.weight"].shape, (std::vector<std::int64_t>{8, 64}));
}

TEST(ParamSpec, TiedEmbeddingsHaveNoLmHead) {
  for (const ParamSpec& s : param_specs(parse_ok(kConfigs[2]))) {
    EXPECT_NE(s.role, ParamRole::kLmHead);
  }
}

// Parameter counts transformers 5.17 printed when it generated tests/data/models (fixtures.log).
TEST(ParamSpec, MatchesTransformersCountsForFixtures) {
  const std::map<std::string, std::int64_t> want = {{"llama", 94528},    {"qwen2", 78400},
                                                    {"qwen3", 119232},   {"qwen3_moe", 187936},
                                                    {"mixtral", 131904}, {"olmoe", 157184}};
  for (const auto& [name, params] : want) {
    auto c = load_model_config(std::string(FERRY_TEST_DATA_DIR) + "/models/" + name);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(total_numel(param_specs(*c)), params) << name;
  }
}

}  // namespace
}  // namespace ferry::model
