// SPDX-License-Identifier: Apache-2.0
// bf16 dense weights (EngineConfig::dense_dtype, docs/serve.md "bf16 dense weights"), the CPU side:
//   - the CPU engine with bf16 dense weights gives the f32 engine's token ids and logits bits on
//     the dense weights rounded to bf16 (round to nearest even, widened back: exact), with 3
//     concurrent requests mixing prefill chunks and decodes, for a Qwen3-MoE, a dense Qwen3 and
//     a dense Qwen2 with tied embeddings; in the BLAS path and the batch-invariant one;
//   - every expert mode (resident, static, cpu-experts, paged at caps from top-k to E, LRU and
//     LFU) gives the same bits as bf16 resident;
//   - the bf16 copy holds the rounded bits (tied tensors once), dense_weight_bytes halves the
//     linear weights and keeps norms and biases in f32, DeviceWeights (the emulated device tier
//     in a CPU build) charges the bf16 bytes as "dense weights", and the bench's CPU sizing gives
//     the bytes saved to expert slots;
//   - bad dtypes are refused with a Status naming the accepted ones.
// The CUDA engine's side: tests/gpu/serve_dense_bf16_gpu_test.cpp.
#include <cstring>
#include <set>

#include <gtest/gtest.h>

#include "mem/transfer_engine.h"
#include "serve/bench/serve_bench.h"
#include "serve/dense_weights.h"
#include "serve/device_weights.h"
#include "serve/engine.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

EngineConfig mixed_config(ExpertMode mode = ExpertMode::kResident, int cap = 0,
                          EvictionPolicy policy = EvictionPolicy::kLru) {
  EngineConfig cfg;
  cfg.pager.mode = mode;
  cfg.pager.slots_per_layer = cap;
  cfg.pager.policy = policy;
  cfg.max_batch_tokens = 8;  // prompts in chunks, mixed with other requests' decodes
  cfg.max_running = 3;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  return cfg;
}

Result<testing::RunRecord> run(const model::DecoderGeometry& geo, const model::ModelParams& p,
                               const EngineConfig& cfg, std::uint64_t* misses = nullptr) {
  FERRY_ASSIGN_OR_RETURN(auto eng, Engine::create(geo, p, cfg));
  FERRY_ASSIGN_OR_RETURN(auto rec, testing::run_engine(*eng, testing::mixed_requests(geo.vocab)));
  if (misses != nullptr && eng->experts().pager() != nullptr) {
    *misses = eng->experts().pager()->counters().misses;
  }
  return rec;
}

TEST(DenseDtype, ParseAcceptsF32AndBf16AndBadValuesAreRefused) {
  EXPECT_EQ(*parse_dense_dtype("f32"), DType::kF32);
  EXPECT_EQ(*parse_dense_dtype("bf16"), DType::kBF16);
  for (const char* bad : {"fp16", "BF16", "", "f16"}) {
    auto d = parse_dense_dtype(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("f32, bf16"), std::string::npos) << d.status().message();
  }
  auto m = testing::tiny_builtin_moe(5);
  ASSERT_TRUE(m);
  EngineConfig cfg;
  cfg.dense_dtype = DType::kF16;
  auto eng = Engine::create(m->geometry, m->params, cfg);
  ASSERT_FALSE(eng.ok());
  EXPECT_EQ(eng.status().code(), StatusCode::kInvalidArgument) << eng.status().to_string();
  EXPECT_FALSE(HostDenseWeights::create(m->params, DType::kF32).ok());
}

TEST(DenseDtype, HostCopyHoldsTheRoundedBitsAndTheBytesHalve) {
  for (const char* arch : {"qwen3_moe", "qwen2"}) {
    SCOPED_TRACE(arch);
    const testing::Fixture f = testing::load_fixture(arch);
    ASSERT_TRUE(f.model);
    const model::ModelParams& p = f.model->params;
    auto w = HostDenseWeights::create(p, DType::kBF16);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const model::ModelParams& b = (*w)->params();
    // Linear weights: bf16 copies of the f32 views; norms and experts: the model's own memory.
    model::ModelParams src = p, got = b;
    std::vector<std::pair<ConstTensorView, ConstTensorView>> pairs;
    for_each_dense_linear(src, [&](ConstTensorView& v) { pairs.push_back({v, {}}); });
    std::size_t i = 0;
    for_each_dense_linear(got, [&](ConstTensorView& v) { pairs[i++].second = v; });
    std::int64_t linear = 0;
    std::set<const void*> distinct;
    for (const auto& [s, g] : pairs) {
      if (s.data == nullptr) {
        EXPECT_EQ(g.data, nullptr);
        continue;
      }
      ASSERT_EQ(g.dtype, DType::kBF16);
      ASSERT_EQ(g.numel(), s.numel());
      const auto* in = static_cast<const float*>(s.data);
      const auto* out = static_cast<const std::uint16_t*>(g.data);
      for (std::int64_t k = 0; k < s.numel(); ++k) ASSERT_EQ(out[k], f32_to_bf16(in[k])) << k;
      if (distinct.insert(s.data).second) linear += s.numel();
    }
    EXPECT_GT(linear, 0);
    if (f.model->geometry.tied_embeddings) {
      EXPECT_EQ(b.embed.data, b.lm_head.data) << "tied embeddings converted once";
    }
    for (std::size_t l = 0; l < p.layers.size(); ++l) {
      EXPECT_EQ(b.layers[l].attn_norm.data, p.layers[l].attn_norm.data);
      EXPECT_EQ(b.layers[l].q_bias.data, p.layers[l].q_bias.data);
      for (std::size_t e = 0; e < p.layers[l].expert_gate.size(); ++e) {
        EXPECT_EQ(b.layers[l].expert_gate[e].data, p.layers[l].expert_gate[e].data);
      }
    }
    EXPECT_GE((*w)->bytes(), std::size_t(linear) * 2);
    const std::size_t f32 = dense_weight_bytes(p, DType::kF32);
    const std::size_t bf16 = dense_weight_bytes(p, DType::kBF16);
    EXPECT_EQ(f32 - bf16, std::size_t(linear) * 2) << "only the linear weights change";
  }
}

// The engine with bf16 dense weights = the f32 engine on the rounded weights, bit for bit.
class DenseBf16Engine : public ::testing::TestWithParam<const char*> {};

TEST_P(DenseBf16Engine, EqualsTheF32EngineOnRoundedWeightsBitForBit) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const auto rounded = testing::round_dense_to_bf16(m.params);
  for (bool invariant : {false, true}) {
    const std::string what =
        fmt::format("{} bf16 dense{}", GetParam(), invariant ? " batch-invariant" : "");
    EngineConfig cfg = mixed_config();
    cfg.batch_invariant = invariant;
    auto want = run(m.geometry, rounded->params, cfg);
    ASSERT_TRUE(want.ok()) << what << ": " << want.status().to_string();
    cfg.dense_dtype = DType::kBF16;
    auto got = run(m.geometry, m.params, cfg);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status().to_string();
    ASSERT_EQ(got->logits.size(), 3u) << what;
    testing::expect_same_bits(*got, *want, what);
    // Not vacuous: the rounding changed the outputs against the unrounded f32 engine.
    cfg.dense_dtype = DType::kF32;
    auto plain = run(m.geometry, m.params, cfg);
    ASSERT_TRUE(plain.ok());
    bool differs = false;
    for (const auto& [id, rows] : plain->logits) {
      for (std::size_t i = 0; i < rows.size(); ++i) {
        differs |= !testing::same_bits(rows[i], got->logits.at(id)[i]);
      }
    }
    EXPECT_TRUE(differs) << what << ": bf16 rounding changed no logits bit";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DenseBf16Engine,
                         ::testing::Values("qwen3_moe", "qwen3", "qwen2", "mixtral"));

TEST(DenseBf16Modes, EveryModeAndCapGivesBf16ResidentsBits) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const int K = m.geometry.top_k, E = m.geometry.experts;
  EngineConfig ref_cfg = mixed_config();
  ref_cfg.dense_dtype = DType::kBF16;
  auto ref = run(m.geometry, m.params, ref_cfg);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  struct V {
    ExpertMode mode;
    int cap;
    EvictionPolicy policy;
  };
  const std::vector<V> variants = {{ExpertMode::kStatic, 0, EvictionPolicy::kLru},
                                   {ExpertMode::kCpuExperts, 0, EvictionPolicy::kLru},
                                   {ExpertMode::kPaged, K, EvictionPolicy::kLru},
                                   {ExpertMode::kPaged, K + 1, EvictionPolicy::kLfu},
                                   {ExpertMode::kPaged, E, EvictionPolicy::kLru}};
  for (const V& v : variants) {
    const std::string name =
        fmt::format("bf16 dense {} cap {} {}", to_string(v.mode), v.cap, to_string(v.policy));
    EngineConfig cfg = mixed_config(v.mode, v.cap, v.policy);
    cfg.dense_dtype = DType::kBF16;
    std::uint64_t misses = 0;
    auto got = run(m.geometry, m.params, cfg, &misses);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().to_string();
    testing::expect_same_bits(*got, *ref, name);
    if (v.mode == ExpertMode::kPaged && v.cap < E) {
      EXPECT_GT(misses, 0u) << name;
    }
  }
}

TEST(DenseDtype, DeviceWeightsChargeTheBf16Bytes) {
  // The upload goes to the device tier and is read back here: only where that tier is host
  // memory (CPU builds); the GPU test checks the CUDA engine's budget.
  if (!mem::device_tier_is_host_memory()) {
    GTEST_SKIP() << "the device tier is GPU memory in this build";
  }
  const testing::Fixture f = testing::load_fixture("qwen2");  // tied embeddings, qkv biases
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  std::size_t bytes[2] = {0, 0};
  int i = 0;
  for (DType dense : {DType::kF32, DType::kBF16}) {
    mem::MemoryBudget budget(mem::MemTier::kDevice);
    auto w = DeviceWeights::create(m.geometry, m.params, /*with_experts=*/false, DType::kF32, dense,
                                   mem::host_transfer_engine(), mem::Stream::host(), &budget);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    EXPECT_EQ(budget.bytes_used(), (*w)->bytes());
    bytes[i++] = (*w)->bytes();
    const model::ModelParams& d = (*w)->params();
    EXPECT_EQ(d.layers[0].q.dtype, dense);
    EXPECT_EQ(d.lm_head.dtype, dense);
    EXPECT_EQ(d.embed.data, d.lm_head.data);
    EXPECT_EQ(d.layers[0].attn_norm.dtype, DType::kF32);
    EXPECT_EQ(d.layers[0].q_bias.dtype, DType::kF32);
    if (dense == DType::kBF16) {
      const auto* got = static_cast<const std::uint16_t*>(d.layers[1].o.data);
      const auto* src = static_cast<const float*>(m.params.layers[1].o.data);
      for (std::int64_t k = 0; k < m.params.layers[1].o.numel(); ++k) {
        ASSERT_EQ(got[k], f32_to_bf16(src[k])) << k;
      }
    }
  }
  // Every tensor in a 256-byte aligned slot: the saving is the linear weights' half, up to
  // that padding.
  const std::size_t saved =
      dense_weight_bytes(m.params, DType::kF32) - dense_weight_bytes(m.params, DType::kBF16);
  EXPECT_LT(bytes[1], bytes[0]);
  EXPECT_LE(bytes[0] - bytes[1], saved + 256 * 64);
  EXPECT_GE(bytes[0] - bytes[1] + 256 * 64, saved);
}

TEST(DenseDtype, BenchSizingGivesTheSavedBytesToExpertSlots) {
  auto m = make_builtin_moe({.vocab = 512,
                             .layers = 2,
                             .hidden = 64,
                             .heads = 4,
                             .kv_heads = 2,
                             .head_dim = 16,
                             .experts = 16,
                             .top_k = 2,
                             .expert_width = 32},
                            7);
  ASSERT_TRUE(m.ok());
  const model::DecoderGeometry& geo = (*m)->geometry;
  const std::size_t f32 = dense_weight_bytes((*m)->params, DType::kF32);
  const std::size_t bf16 = dense_weight_bytes((*m)->params, DType::kBF16);
  ASSERT_LT(bf16, f32);
  bench::ServeBenchConfig bc;
  bc.modes = {ExpertMode::kResident, ExpertMode::kPaged};
  for (int i = 0; i < 12; ++i) bc.prompt.push_back((i * 31 + 7) % geo.vocab);
  bc.decode_tokens = 3;
  bc.roofline_gbps = 10;
  const std::size_t expert = 3 * std::size_t(geo.hidden) * std::size_t(geo.expert_width) * 4;
  std::size_t moe_layers = 0;
  for (bool moe : geo.layer_is_moe) moe_layers += moe ? 1 : 0;
  const std::size_t row = expert * moe_layers;  // one slot in each MoE layer
  // KV for 16 positions: 1 block x 2 layers x (K, V) x 16 x 2 kv heads x 16 dims f32.
  const std::size_t kv = 2 * 2 * 16 * 2 * 16 * 4;
  bc.budget_bytes = f32 + kv + 3 * row + row / 2;  // f32: 3 slots per layer
  bc.dense_bytes = f32;
  auto a = bench::run_serve_bench(geo, (*m)->params, bc);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  bc.dense_dtype = DType::kBF16;
  bc.dense_bytes = bf16;
  auto b = bench::run_serve_bench(geo, (*m)->params, bc);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(a->kv_bytes, kv);
  EXPECT_EQ(a->slots_per_layer, 3);
  EXPECT_EQ(std::size_t(b->slots_per_layer),
            std::min<std::size_t>(geo.experts, (f32 - bf16 + 3 * row + row / 2) / row));
  EXPECT_GT(b->slots_per_layer, a->slots_per_layer);
  const Json j = bench::report_json(*b);
  EXPECT_EQ(j["dense_dtype"], "bf16");
  EXPECT_EQ(j["sizing"]["dense_bytes_charged"].get<std::size_t>(), bf16);
  // Both modes ran on the bf16 dense engine with the same bits.
  ASSERT_EQ(b->modes.size(), 2u);
  EXPECT_TRUE(b->modes[1].ran);
  EXPECT_EQ(b->modes[1].tokens, b->modes[0].tokens);
  EXPECT_EQ(b->modes[1].logits_hash, b->modes[0].logits_hash);
}

}  // namespace
}  // namespace ferry::serve
