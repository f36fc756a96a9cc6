// SPDX-License-Identifier: Apache-2.0
// config.json parsing for the six architectures in both transformers spellings (4.x rope_theta +
// rope_scaling, 5.x rope_parameters), defaults, and one test per class of bad input.
#include "model/config.h"

#include <gtest/gtest.h>

#include <string>

#include "unit/model/model_test_util.h"

namespace ferry::model {
namespace {

using kernels::RopeType;

Result<ModelConfig> parse(const std::string& text) { return parse_model_config_text(text, "cfg"); }

ModelConfig parse_ok(const std::string& text) {
  auto c = parse(text);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? *c : ModelConfig{};
}

void expect_error(const std::string& text, StatusCode code, const std::string& needle) {
  auto c = parse(text);
  ASSERT_FALSE(c.ok()) << "accepted: " << text;
  EXPECT_EQ(c.status().code(), code) << c.status().to_string();
  EXPECT_NE(c.status().message().find(needle), std::string::npos)
      << "message: " << c.status().message() << "\nwanted: " << needle;
}

// Llama 3.1 8B's config.json (4.x form), abridged to the keys we read.
const std::string kLlama31 = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "torch_dtype": "bfloat16"})";

TEST(Config, Llama31RopeScaling4x) {
  const ModelConfig c = parse_ok(kLlama31);
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.head_dim, 128);  // 4096 / 32
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rope.type, RopeType::kLlama3);
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_FALSE(c.is_moe());
}

TEST(Config, Llama5xRopeParametersAndDefaults) {
  const ModelConfig c = parse_ok(R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "attention_bias": true,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})");
  EXPECT_EQ(c.rope.type, RopeType::kLlama3);
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 64);
  EXPECT_EQ(c.num_key_value_heads, 4);         // defaults to heads
  EXPECT_EQ(c.head_dim, 16);                   // hidden / heads
  EXPECT_EQ(c.max_position_embeddings, 2048);  // LlamaConfig default
  EXPECT_EQ(c.rms_norm_eps, 1e-6);             // LlamaConfig default
  EXPECT_TRUE(c.qkv_bias);                     // attention_bias covers q/k/v ...
  EXPECT_TRUE(c.o_bias);                       // ... and o
}

TEST(Config, Qwen2BothForms) {
  const std::string base = R"("model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "tie_word_embeddings": true, "use_sliding_window": false,
    "sliding_window": 32768, )";
  const ModelConfig a = parse_ok("{" + base + R"("rope_theta": 1000000.0, "rope_scaling": null})");
  const ModelConfig b =
      parse_ok("{" + base + R"("rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})");
  for (const ModelConfig* c : {&a, &b}) {
    EXPECT_EQ(c->arch, Arch::kQwen2);
    EXPECT_EQ(c->head_dim, 64);
    EXPECT_TRUE(c->qkv_bias);  // always for Qwen2
    EXPECT_FALSE(c->o_bias);
    EXPECT_TRUE(c->tie_word_embeddings);
    EXPECT_EQ(c->rope.type, RopeType::kDefault);
    EXPECT_EQ(c->rope.theta, 1e6);
    EXPECT_EQ(c->sliding_window, 0);  // use_sliding_window false
    EXPECT_EQ(c->max_position_embeddings, 32768);
  }
}

TEST(Config, Qwen3ExplicitAndDefaultHeadDim) {
  const std::string base = R"("model_type": "qwen3", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, )";
  const ModelConfig a = parse_ok("{" + base + R"("head_dim": 32, "rope_theta": 1e6})");
  EXPECT_EQ(a.head_dim, 32);
  EXPECT_EQ(a.q_dim(), 128);
  EXPECT_EQ(a.qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(a.rope.theta, 1e6);
  const ModelConfig b = parse_ok("{" + base + R"("rope_parameters": {"rope_type": "default",
      "rope_theta": 1e6}})");
  EXPECT_EQ(b.head_dim, 128);  // Qwen3Config's own default, not hidden / heads
}

TEST(Config, Qwen3MoeBothForms) {
  const std::string base = R"("model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
    "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "moe_intermediate_size": 768,
    "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1,
    "mlp_only_layers": [], )";
  const ModelConfig a =
      parse_ok("{" + base + R"("num_experts": 128, "rope_theta": 1e6, "rope_scaling": null})");
  const ModelConfig b = parse_ok("{" + base + R"("num_local_experts": 128,
      "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})");
  for (const ModelConfig* c : {&a, &b}) {
    EXPECT_EQ(c->arch, Arch::kQwen3Moe);
    EXPECT_EQ(c->num_experts, 128);
    EXPECT_EQ(c->num_experts_per_tok, 8);
    EXPECT_EQ(c->moe_intermediate_size, 768);
    EXPECT_EQ(c->router_norm, RouterNorm::kSoftmaxThenTopKRenormalize);
    EXPECT_EQ(c->head_dim, 128);
    EXPECT_EQ(c->qk_norm, QkNorm::kPerHead);
    EXPECT_TRUE(c->is_moe_layer(0));
    EXPECT_TRUE(c->is_moe_layer(47));
  }
}

TEST(Config, Qwen3MoeSparseStepAndMlpOnlyLayers) {
  const ModelConfig c = parse_ok(R"({"model_type": "qwen3_moe", "vocab_size": 256,
    "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6, "num_attention_heads": 4,
    "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
    "decoder_sparse_step": 2, "mlp_only_layers": [3]})");
  EXPECT_EQ(c.router_norm, RouterNorm::kSoftmaxThenTopK);  // norm_topk_prob default false
  EXPECT_EQ(c.head_dim, 16);                               // no class default: hidden / heads
  // (l + 1) % 2 == 0 -> layers 1, 3, 5; 3 is in mlp_only_layers.
  const bool want[6] = {false, true, false, false, false, true};
  for (int l = 0; l < 6; ++l) EXPECT_EQ(c.is_moe_layer(l), want[l]) << "layer " << l;
}

TEST(Config, MixtralBothForms) {
  const std::string base = R"("model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "sliding_window": null, "head_dim": null, )";
  const ModelConfig a = parse_ok("{" + base + R"("rope_theta": 1e6})");
  const ModelConfig b =
      parse_ok("{" + base + R"("rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})");
  for (const ModelConfig* c : {&a, &b}) {
    EXPECT_EQ(c->arch, Arch::kMixtral);
    EXPECT_EQ(c->num_experts, 8);
    EXPECT_EQ(c->moe_intermediate_size, 14336);  // experts use intermediate_size
    EXPECT_EQ(c->router_norm, RouterNorm::kSoftmaxThenTopKRenormalize);  // always
    EXPECT_EQ(c->head_dim, 128);
    EXPECT_EQ(c->rms_norm_eps, 1e-5);  // MixtralConfig default
    EXPECT_EQ(c->sliding_window, 0);
    EXPECT_EQ(c->rope.theta, 1e6);
  }
  // Mixtral's default rope_theta is 1e6 when absent.
  EXPECT_EQ(parse_ok("{" + base.substr(0, base.size() - 2) + "}").rope.theta, 1e6);
}

TEST(Config, OlmoeBothForms) {
  const std::string base = R"("model_type": "olmoe", "vocab_size": 50304, "hidden_size": 2048,
    "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16,
    "num_experts": 64, "num_experts_per_tok": 8, "clip_qkv": null, )";
  const ModelConfig a = parse_ok("{" + base + R"("rope_theta": 10000.0, "rope_scaling": null})");
  const ModelConfig b = parse_ok("{" + base + R"("norm_topk_prob": false,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})");
  for (const ModelConfig* c : {&a, &b}) {
    EXPECT_EQ(c->arch, Arch::kOlmoe);
    EXPECT_EQ(c->qk_norm, QkNorm::kFullWidth);
    EXPECT_EQ(c->router_norm, RouterNorm::kSoftmaxThenTopK);
    EXPECT_EQ(c->moe_intermediate_size, 1024);
    EXPECT_EQ(c->num_key_value_heads, 16);
    EXPECT_EQ(c->clip_qkv, 0.0);
    EXPECT_EQ(c->max_position_embeddings, 4096);
  }
}

TEST(Config, RopeTypesAndNestedParameters) {
  const std::string base = R"("model_type": "llama", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "max_position_embeddings": 4096, )";
  // 4.x "type" spelling of linear scaling.
  const ModelConfig lin =
      parse_ok("{" + base + R"("rope_scaling": {"type": "linear", "factor": 2.0}})");
  EXPECT_EQ(lin.rope.type, RopeType::kLinear);
  EXPECT_EQ(lin.rope.factor, 2.0);
  EXPECT_EQ(lin.rope.theta, 10000.0);
  // yarn without original_max_position_embeddings takes max_position_embeddings.
  const ModelConfig yarn = parse_ok("{" + base + R"("rope_parameters": {"rope_type": "yarn",
      "rope_theta": 1e6, "factor": 4.0, "beta_fast": 16}})");
  EXPECT_EQ(yarn.rope.type, RopeType::kYarn);
  EXPECT_EQ(yarn.rope.beta_fast, 16.0);
  EXPECT_EQ(yarn.rope.original_max_position_embeddings, 4096);
  // 5.x nested per attention type: the full_attention entry is used.
  const ModelConfig nested = parse_ok("{" + base + R"("rope_parameters": {
      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
      "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}}})");
  EXPECT_EQ(nested.rope.type, RopeType::kLinear);
  EXPECT_EQ(nested.rope.theta, 1e6);
  EXPECT_EQ(nested.rope.factor, 8.0);
  // partial_rotary_factor at top level.
  EXPECT_EQ(parse_ok("{" + base + R"("partial_rotary_factor": 0.5})").rope.partial_rotary_factor,
            0.5);
}

const std::string kSmall = R"("vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2)";

TEST(ConfigBad, NotJson) {
  auto c = parse("{\"model_type\": \"llama\",");
  EXPECT_EQ(c.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(c.status().message().find("cfg"), std::string::npos);
  expect_error("[1, 2]", StatusCode::kInvalidArgument, "not a JSON object");
}

TEST(ConfigBad, UnknownModelTypeListsSupported) {
  expect_error(R"({"model_type": "gpt2", )" + kSmall + R"(, "num_attention_heads": 4})",
               StatusCode::kUnimplemented,
               "unsupported model_type \"gpt2\" (supported: llama, qwen2, qwen3, qwen3_moe, "
               "mixtral, olmoe)");
  expect_error(R"({"vocab_size": 3})", StatusCode::kInvalidArgument, "missing model_type");
}

TEST(ConfigBad, MissingRequiredKey) {
  expect_error(R"({"model_type": "llama", "vocab_size": 256, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4})",
               StatusCode::kInvalidArgument, "missing required key hidden_size");
  expect_error(R"({"model_type": "mixtral", )" + kSmall + R"(, "num_attention_heads": 4,
    "num_experts_per_tok": 2})",
               StatusCode::kInvalidArgument, "missing required key num_experts");
  expect_error(R"({"model_type": "qwen3_moe", )" + kSmall + R"(, "num_attention_heads": 4,
    "num_experts": 4, "num_experts_per_tok": 2})",
               StatusCode::kInvalidArgument, "missing required key moe_intermediate_size");
}

TEST(ConfigBad, WrongTypeOfValue) {
  expect_error(R"({"model_type": "llama", "vocab_size": "256", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4})",
               StatusCode::kInvalidArgument, "key vocab_size must be an integer, found \"256\"");
}

TEST(ConfigBad, NonPositiveSizes) {
  expect_error(R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 0, "num_attention_heads": 4})",
               StatusCode::kInvalidArgument, "num_hidden_layers must be positive, found 0");
  expect_error(R"({"model_type": "llama", "vocab_size": -5, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4})",
               StatusCode::kInvalidArgument, "vocab_size must be positive, found -5");
}

TEST(ConfigBad, HeadsNotDividingHidden) {
  expect_error(R"({"model_type": "llama", )" + kSmall + R"(, "num_attention_heads": 5})",
               StatusCode::kInvalidArgument,
               "num_attention_heads 5 does not divide hidden_size 64");
}

TEST(ConfigBad, KvHeadsNotDividingHeads) {
  expect_error(R"({"model_type": "llama", )" + kSmall +
                   R"(, "num_attention_heads": 4, "num_key_value_heads": 3})",
               StatusCode::kInvalidArgument,
               "num_key_value_heads 3 does not divide num_attention_heads 4");
}

TEST(ConfigBad, TopKExceedsExperts) {
  expect_error(R"({"model_type": "mixtral", )" + kSmall + R"(, "num_attention_heads": 4,
    "num_local_experts": 4, "num_experts_per_tok": 5})",
               StatusCode::kInvalidArgument, "num_experts_per_tok 5 exceeds the 4 experts");
}

TEST(ConfigBad, ExpertCountSpellingsDisagree) {
  expect_error(R"({"model_type": "olmoe", )" + kSmall + R"(, "num_attention_heads": 4,
    "num_experts": 8, "num_local_experts": 4, "num_experts_per_tok": 2})",
               StatusCode::kInvalidArgument, "num_experts 8 and num_local_experts 4 disagree");
}

TEST(ConfigBad, MlpOnlyLayerOutOfRange) {
  expect_error(R"({"model_type": "qwen3_moe", )" + kSmall + R"(, "num_attention_heads": 4,
    "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
    "mlp_only_layers": [7]})",
               StatusCode::kInvalidArgument, "mlp_only_layers entry 7");
}

TEST(ConfigBad, UnknownRopeType) {
  expect_error(R"({"model_type": "llama", )" + kSmall + R"(, "num_attention_heads": 4,
    "rope_scaling": {"rope_type": "longrope", "factor": 2.0}})",
               StatusCode::kInvalidArgument, "unknown rope type \"longrope\"");
}

TEST(ConfigBad, RopeMissingRequiredField) {
  expect_error(R"({"model_type": "llama", )" + kSmall + R"(, "num_attention_heads": 4,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}})",
               StatusCode::kInvalidArgument,
               "rope type llama3 needs rope_parameters.low_freq_factor");
  expect_error(R"({"model_type": "llama", )" + kSmall + R"(, "num_attention_heads": 4,
    "rope_scaling": {"rope_type": "linear"}})",
               StatusCode::kInvalidArgument, "rope type linear needs rope_scaling.factor");
}

TEST(ConfigBad, UnsupportedActivation) {
  expect_error(R"({"model_type": "llama", )" + kSmall +
                   R"(, "num_attention_heads": 4, "hidden_act": "gelu"})",
               StatusCode::kUnimplemented, "hidden_act \"gelu\"");
}

TEST(ConfigBad, MissingFileNamesPath) {
  testing::TempDir dir;
  auto c = load_model_config(dir.path());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("config.json"), std::string::npos);
}

}  // namespace
}  // namespace ferry::model
