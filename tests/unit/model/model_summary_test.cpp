// SPDX-License-Identifier: Apache-2.0
// summarize(): totals agree with param_specs, active-per-token removes exactly (E - K) experts
// per MoE layer, and checkpoint bytes per dtype add up to the fixture's data.
#include "model/model_summary.h"

#include <gtest/gtest.h>

#include "model/param_spec.h"

namespace ferry::model {
namespace {

std::string fixture(const std::string& arch) {
  return std::string(FERRY_TEST_DATA_DIR) + "/models/" + arch;
}

TEST(ModelSummary, DenseActiveEqualsTotal) {
  auto c = load_model_config(fixture("llama"));
  ASSERT_TRUE(c.ok());
  auto ck = Checkpoint::open(fixture("llama"));
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelSummary s = summarize(*c, &*ck);
  EXPECT_EQ(s.total_params, 94528);  // transformers' count (fixtures.log)
  EXPECT_EQ(s.active_params, s.total_params);
  EXPECT_EQ(s.checkpoint_shards, 7u);
  EXPECT_EQ(s.checkpoint_bytes_per_dtype.at("f32"), 94528u * 4);
  EXPECT_EQ(s.embedding_params, 2 * 256 * 64);
  std::int64_t sum = s.embedding_params + c->hidden_size;  // + final norm
  for (const LayerSummary& L : s.layers) sum += L.attention_params + L.mlp_params + L.norm_params;
  EXPECT_EQ(sum, s.total_params);
  EXPECT_NE(to_text(s).find("llama3 (theta 500000, factor 8, low 1, high 4, original 64)"),
            std::string::npos)
      << to_text(s);
}

TEST(ModelSummary, MoeActiveCountsTopKExperts) {
  auto c = load_model_config(fixture("qwen3_moe"));
  ASSERT_TRUE(c.ok());
  const ModelSummary s = summarize(*c, nullptr);
  // Expert: 3 * C * Fe = 3 * 64 * 32; layers 0 and 2 are MoE (mlp_only_layers [1]); E=8, K=2.
  const std::int64_t expert = 3 * 64 * 32;
  EXPECT_EQ(s.layers[0].expert_params, expert);
  EXPECT_FALSE(s.layers[1].moe);
  EXPECT_EQ(s.total_params, 187936);
  EXPECT_EQ(s.active_params, s.total_params - 2 * (8 - 2) * expert);
  const Json j = to_json(s);
  EXPECT_EQ(j["params"]["active_per_token"].get<std::int64_t>(), s.active_params);
  EXPECT_EQ(j["moe"]["num_experts"].get<int>(), 8);
}

}  // namespace
}  // namespace ferry::model
