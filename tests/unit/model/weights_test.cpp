// SPDX-License-Identifier: Apache-2.0
// ModelWeights: loads every transformers fixture in tests/data/models (hub names, sharded llama),
// converts bf16 -> f32, accepts the fused 5.x expert form (plain and transposed), and rejects
// missing / misshapen / wrong-architecture tensors with named errors.
#include "model/weights.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "model/safetensors_writer.h"
#include "unit/model/model_test_util.h"

namespace ferry::model {
namespace {

using testing::TempDir;
using testing::write_text;

std::string fixture(const std::string& arch) {
  return std::string(FERRY_TEST_DATA_DIR) + "/models/" + arch;
}

TEST(Weights, LoadsEveryFixtureZeroCopy) {
  for (const char* arch : {"llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "olmoe"}) {
    auto w = ModelWeights::load(fixture(arch));
    ASSERT_TRUE(w.ok()) << arch << ": " << w.status().to_string();
    EXPECT_EQ(w->views().size(), w->specs().size());
    // The fixtures are F32 and written by safetensors with aligned offsets.
    EXPECT_EQ(w->zero_copy_tensors(), w->specs().size()) << arch;
    EXPECT_EQ(w->owned_bytes(), 0u) << arch;
    for (std::size_t i = 0; i < w->specs().size(); ++i) {
      const auto& v = w->views()[i];
      EXPECT_EQ(v.numel(), w->specs()[i].numel()) << w->specs()[i].hf_name;
      EXPECT_NE(v.data, nullptr);
    }
    const ModelConfig& c = w->config();
    for (int l = 0; l < w->num_layers(); ++l) {
      EXPECT_EQ(w->layer(l).is_moe(), c.is_moe_layer(l)) << arch << " layer " << l;
      if (w->layer(l).is_moe()) {
        EXPECT_NE(w->layer(l).router.data, nullptr);
      }
    }
    if (c.tie_word_embeddings) {
      EXPECT_EQ(w->lm_head().data, w->embed().data);
    }
  }
}

TEST(Weights, ViewsMatchCheckpointBytes) {
  auto w = ModelWeights::load(fixture("mixtral"));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto raw = w->checkpoint().view("model.layers.1.block_sparse_moe.experts.2.w2.weight");
  ASSERT_TRUE(raw.ok());
  const ConstTensorView& down = w->layer(1).experts[2].down;
  EXPECT_EQ(down.shape_string(), "[64, 48]");
  EXPECT_EQ(std::memcmp(down.data, raw->data, down.bytes()), 0);
}

// A tiny Qwen3-MoE folder written by the test: config + tensors built from param_specs.
struct TinyMoe {
  TempDir dir;
  ModelConfig config;
  std::map<std::string, std::vector<float>> tensors;  // name -> f32 data
  static constexpr const char* kConfig = R"({"model_type": "qwen3_moe", "vocab_size": 32,
    "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 4, "moe_intermediate_size": 6, "num_experts": 3,
    "num_experts_per_tok": 2, "mlp_only_layers": [1]})";

  TinyMoe() {
    write_text(dir.file("config.json"), kConfig);
    config = *parse_model_config_text(kConfig, "tiny");
    float next = 0.0f;
    for (const ParamSpec& s : param_specs(config)) {
      std::vector<float> v(static_cast<std::size_t>(s.numel()));
      for (float& x : v) x = next++;
      tensors[s.hf_name] = std::move(v);
    }
  }
  static std::vector<std::int64_t> shape_of(const ModelConfig& c, const std::string& name) {
    for (const ParamSpec& s : param_specs(c)) {
      if (s.hf_name == name) return s.shape;
    }
    return {};
  }
  // Writes model.safetensors from `tensors` (+ extras), converting to `dt`.
  void write(DType dt,
             const std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>>&
                 extra = {},
             const std::vector<std::string>& skip = {}) {
    std::vector<std::vector<std::uint8_t>> store;
    std::vector<NamedTensor> named;
    auto add = [&](const std::string& name, const std::vector<std::int64_t>& shape,
                   const std::vector<float>& data) {
      std::vector<std::uint8_t> b(data.size() * dtype_size(dt));
      if (dt == DType::kI32) {  // convert_elements does floats only
        for (std::size_t i = 0; i < data.size(); ++i) {
          const auto x = static_cast<std::int32_t>(data[i]);
          std::memcpy(b.data() + 4 * i, &x, 4);
        }
      } else {
        ASSERT_TRUE(convert_elements(data.data(), DType::kF32, b.data(), dt, data.size()));
      }
      store.push_back(std::move(b));
      ConstTensorView v;
      v.data = store.back().data();
      v.dtype = dt;
      v.ndim = static_cast<int>(shape.size());
      std::int64_t st = 1;
      for (int i = v.ndim - 1; i >= 0; --i) v.shape[i] = shape[i], v.stride[i] = st, st *= shape[i];
      named.push_back({name, v});
    };
    store.reserve(tensors.size() + extra.size());
    for (const auto& [name, data] : tensors) {
      if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
      add(name, shape_of(config, name), data);
    }
    for (const auto& [name, sd] : extra) add(name, sd.first, sd.second);
    FERRY_CHECK_OK(write_safetensors(dir.file("model.safetensors"), named));
  }
};

TEST(Weights, ConvertsBf16ToF32) {
  TinyMoe m;
  m.write(DType::kBF16);  // values 0..N are small integers, exact in bf16 up to 256
  auto w = ModelWeights::load(m.dir.path());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->zero_copy_tensors(), 0u);
  EXPECT_GT(w->owned_bytes(), 0u);
  const ConstTensorView& emb = w->embed();
  EXPECT_EQ(emb.dtype, DType::kF32);
  const auto& want = m.tensors["model.embed_tokens.weight"];
  for (std::size_t i = 0; i < 200; ++i) {
    EXPECT_EQ(emb.as<float>()[i], bf16_to_f32(f32_to_bf16(want[i]))) << i;
  }
}

// Fused 5.x experts: gate_up [E, 2F, C] (gate rows first) and down [E, C, F], or transposed.
void check_fused(bool transposed) {
  TinyMoe m;
  const std::int64_t E = 3, F = 6, C = 8;
  std::vector<std::string> skip;
  std::vector<float> gate_up(static_cast<std::size_t>(E * 2 * F * C)),
      down(static_cast<std::size_t>(E * C * F));
  for (std::int64_t e = 0; e < E; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    const auto& g = m.tensors[p + "gate_proj.weight"];
    const auto& u = m.tensors[p + "up_proj.weight"];
    const auto& d = m.tensors[p + "down_proj.weight"];
    for (std::int64_t r = 0; r < 2 * F; ++r) {
      for (std::int64_t c = 0; c < C; ++c) {
        const float v = r < F ? g[r * C + c] : u[(r - F) * C + c];
        const std::int64_t idx = transposed ? (e * C + c) * 2 * F + r : (e * 2 * F + r) * C + c;
        gate_up[static_cast<std::size_t>(idx)] = v;
      }
    }
    for (std::int64_t c = 0; c < C; ++c) {
      for (std::int64_t f = 0; f < F; ++f) {
        const std::int64_t idx = transposed ? (e * F + f) * C + c : (e * C + c) * F + f;
        down[static_cast<std::size_t>(idx)] = d[c * F + f];
      }
    }
    for (const char* n : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
      skip.push_back(p + n);
    }
  }
  const std::vector<std::int64_t> gu_shape =
      transposed ? std::vector<std::int64_t>{E, C, 2 * F} : std::vector<std::int64_t>{E, 2 * F, C};
  const std::vector<std::int64_t> d_shape =
      transposed ? std::vector<std::int64_t>{E, F, C} : std::vector<std::int64_t>{E, C, F};
  m.write(DType::kF32,
          {{"model.layers.0.mlp.experts.gate_up_proj", {gu_shape, gate_up}},
           {"model.layers.0.mlp.experts.down_proj", {d_shape, down}}},
          skip);
  auto w = ModelWeights::load(m.dir.path());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const LayerWeights& L = w->layer(0);
  ASSERT_EQ(L.experts.size(), 3u);
  for (std::int64_t e = 0; e < E; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    const ExpertWeights& x = L.experts[static_cast<std::size_t>(e)];
    EXPECT_EQ(x.gate.shape_string(), "[6, 8]");
    EXPECT_EQ(x.down.shape_string(), "[8, 6]");
    EXPECT_EQ(std::memcmp(x.gate.data, m.tensors[p + "gate_proj.weight"].data(), x.gate.bytes()), 0)
        << "expert " << e << (transposed ? " transposed" : "");
    EXPECT_EQ(std::memcmp(x.up.data, m.tensors[p + "up_proj.weight"].data(), x.up.bytes()), 0);
    EXPECT_EQ(std::memcmp(x.down.data, m.tensors[p + "down_proj.weight"].data(), x.down.bytes()),
              0);
  }
}

TEST(Weights, AcceptsFusedExperts) { check_fused(false); }
TEST(Weights, AcceptsTransposedFusedExperts) { check_fused(true); }

TEST(WeightsBad, MissingTensorNamesIt) {
  TinyMoe m;
  m.write(DType::kF32, {}, {"model.layers.0.mlp.experts.2.up_proj.weight"});
  auto w = ModelWeights::load(m.dir.path());
  EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
  EXPECT_NE(w.status().message().find(
                "tensor model.layers.0.mlp.experts.2.up_proj.weight (expert_up, layer 0, expert "
                "2) not found"),
            std::string::npos)
      << w.status().message();
}

TEST(WeightsBad, WrongShapeNamesIt) {
  TinyMoe m;
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  m.write(DType::kF32, {{q, {{8, 4}, std::vector<float>(32, 1.0f)}}}, {q});
  auto w = ModelWeights::load(m.dir.path());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(
      w.status().message().find("model: tensor " + q + ": expected shape [8, 8], found [8, 4]"),
      std::string::npos)
      << w.status().message();
}

TEST(WeightsBad, IntegerDtypeRejected) {
  TinyMoe m;
  m.write(DType::kI32);
  auto w = ModelWeights::load(m.dir.path());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("expected a floating-point dtype, found i32"),
            std::string::npos)
      << w.status().message();
}

TEST(WeightsBad, WrongArchitectureTensorsAreErrors) {
  TinyMoe m;
  // Experts on layer 1, which the config makes dense (mlp_only_layers: [1]).
  m.write(DType::kF32,
          {{"model.layers.1.mlp.experts.0.gate_proj.weight", {{6, 8}, std::vector<float>(48)}}});
  auto w = ModelWeights::load(m.dir.path());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("model.layers.1.mlp.experts.0.gate_proj.weight"),
            std::string::npos)
      << w.status().message();
  // A layer beyond num_hidden_layers.
  m.write(DType::kF32, {{"model.layers.2.input_layernorm.weight", {{8}, std::vector<float>(8)}}});
  auto w2 = ModelWeights::load(m.dir.path());
  EXPECT_EQ(w2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w2.status().message().find("num_hidden_layers 2"), std::string::npos);
}

TEST(Weights, UnrelatedExtraTensorIsOnlyAWarning) {
  TinyMoe m;
  m.write(DType::kF32, {{"some.adapter.weight", {{2}, {1.0f, 2.0f}}},
                        {"model.rotary_emb.inv_freq", {{2}, {1.0f, 2.0f}}}});
  auto w = ModelWeights::load(m.dir.path());
  EXPECT_TRUE(w.ok()) << w.status().to_string();
}

}  // namespace
}  // namespace ferry::model
