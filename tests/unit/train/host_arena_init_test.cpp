// SPDX-License-Identifier: Apache-2.0
// HostArena::create_initialized (what `ferry bench train` fills in place) holds the same bytes as
// HostArena::create from TrainState::from_loaded of the same model written by
// write_builtin_model: streaming weights, master / bf16 weights and compensation, states and
// gradients, for every master x states mode. And an executor over it trains like one over the
// TrainState's arena (bit for bit).
#include <gtest/gtest.h>

#include <cstring>

#include "model/config.h"
#include "train/builtin_model.h"
#include "train_stream_util.h"

namespace ferry::train::stream {
namespace {

const BuiltinModelSpec kSpec = dense_spec();
constexpr std::uint64_t kSeed = 21;

std::unique_ptr<HostArena> initialized(const OptimMode& mode, const model::ModelConfig& config,
                                       const BuiltinModelSpec& spec = kSpec) {
  const std::vector<model::ParamSpec> specs = model::param_specs(config);
  BuiltinInit init(spec, kSeed, specs);
  auto a = HostArena::create_initialized(config, mode, cpu_pinned_tier(),
                                         [&](std::size_t i, float* out) { init.fill(i, out); });
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  return a.ok() ? std::move(*a) : nullptr;
}

void expect_same_bytes_as_the_loaded_models_arena(const BuiltinModelSpec& spec) {
  const std::string dir = testing::temp_dir("arena_init_" + spec.model_type);
  ASSERT_TRUE(write_builtin_model(dir, spec, kSeed).ok());
  auto loaded = model::load_model_f32(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  const std::vector<OptimMode> modes = {
      {},
      {.master = MasterWeights::kF32, .states = OptimizerStates::k8Bit},
      {.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::kF32},
      {.master = MasterWeights::kBf16Sr, .states = OptimizerStates::k8Bit}};
  for (const OptimMode& mode : modes) {
    const std::string what = describe(mode);
    auto s = TrainState::from_loaded(**loaded, mode, kSeed);
    ASSERT_TRUE(s.ok());
    auto want = HostArena::create(**s, cpu_pinned_tier());
    ASSERT_TRUE(want.ok());
    auto got = initialized(mode, (*loaded)->config, spec);
    ASSERT_NE(got, nullptr);
    ASSERT_EQ(got->num_units(), (*want)->num_units()) << what;
    // What `ferry plan` counts for the executor without an arena is what the arena holds.
    const ModelSizes from_arena = model_sizes(*got);
    const ModelSizes from_config = model_sizes((*loaded)->config, got->bf16_weights());
    EXPECT_EQ(from_config.globals_elements, from_arena.globals_elements) << what;
    EXPECT_EQ(from_config.max_layer_elements, from_arena.max_layer_elements) << what;
    EXPECT_EQ(from_config.params, from_arena.params) << what;
    // bf16 weight views: the slot's f32 part (norms, biases, q/k norms, router) — the same from
    // the config as from the arena, and a small part of the layer.
    EXPECT_EQ(from_config.max_layer_f32_elements, from_arena.max_layer_f32_elements) << what;
    EXPECT_GT(from_arena.max_layer_f32_elements, 0) << what;
    EXPECT_LT(from_arena.max_layer_f32_elements, from_arena.max_layer_elements / 4) << what;
    ASSERT_EQ(got->total_bytes(), (*want)->total_bytes()) << what;
    for (int u = 0; u < got->num_units(); ++u) {
      const std::size_t wb = got->unit_weight_bytes(u);
      ASSERT_EQ(wb, (*want)->unit_weight_bytes(u));
      const void* gw = mode.master == MasterWeights::kF32
                           ? static_cast<const void*>(got->weights(u))
                           : got->w16(u);
      const void* ww = mode.master == MasterWeights::kF32
                           ? static_cast<const void*>((*want)->weights(u))
                           : (*want)->w16(u);
      EXPECT_EQ(std::memcmp(gw, ww, wb), 0) << what << ": streaming weights of unit " << u;
      const std::size_t gb = static_cast<std::size_t>(got->unit_elements(u)) * sizeof(float);
      EXPECT_EQ(std::memcmp(got->grads(u), (*want)->grads(u), gb), 0) << what << " grads " << u;
    }
    // Master, bf16 weights + compensation and states, through the checkpoint format.
    auto from_got = TrainState::from_loaded(**loaded, mode, kSeed);
    auto from_want = TrainState::from_loaded(**loaded, mode, kSeed);
    ASSERT_TRUE(from_got.ok() && from_want.ok());
    ASSERT_TRUE(got->store_to(**from_got).ok());
    ASSERT_TRUE((*want)->store_to(**from_want).ok());
    expect_same_state(**from_want, **from_got, what);
  }
}

TEST(HostArenaInit, SameBytesAsTheArenaOfTheLoadedModelInEveryMode) {
  expect_same_bytes_as_the_loaded_models_arena(kSpec);
}

// `ferry bench train --arch qwen2`: the built-in config as HF's Qwen2 (q/k/v biases, no q/k norm),
// which the loader reads back as such; its arena fills in place like the loaded model's.
TEST(HostArenaInit, Qwen2SpecIsHfQwen2AndFillsLikeTheLoadedModel) {
  BuiltinModelSpec spec = kSpec;
  spec.model_type = "qwen2";
  auto config = model::parse_model_config_text(builtin_config_json(spec), "qwen2 spec");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_TRUE(config->qkv_bias);
  EXPECT_FALSE(config->o_bias);
  EXPECT_EQ(config->qk_norm, model::QkNorm::kNone);
  auto qwen3 = model::parse_model_config_text(builtin_config_json(kSpec), "qwen3 spec");
  ASSERT_TRUE(qwen3.ok());
  EXPECT_FALSE(qwen3->qkv_bias);
  EXPECT_NE(qwen3->qk_norm, model::QkNorm::kNone);
  // Each layer: three biases (H*D + 2*G*D) instead of the two q/k norm weights (2*D).
  std::int64_t n2 = 0, n3 = 0;
  for (const model::ParamSpec& p : model::param_specs(*config)) n2 += p.numel();
  for (const model::ParamSpec& p : model::param_specs(*qwen3)) n3 += p.numel();
  const std::int64_t D = spec.head_dim;
  EXPECT_EQ(n2 - n3, std::int64_t(spec.layers) * ((spec.heads + 2 * spec.kv_heads) * D - 2 * D));
  EXPECT_FALSE(known_builtin_model_type("llama"));
  expect_same_bytes_as_the_loaded_models_arena(spec);
}

TEST(HostArenaInit, ExecutorOverTheInitializedArenaTrainsLikeTheStatesArena) {
  const std::string dir = testing::temp_dir("arena_init_train");
  ASSERT_TRUE(write_builtin_model(dir, kSpec, kSeed).ok());
  auto loaded = model::load_model_f32(dir);
  ASSERT_TRUE(loaded.ok());
  const OptimMode mode{.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit};
  auto pol = parse_policy("every:2", kSpec.layers);
  ASSERT_TRUE(pol.ok());
  const StreamOptions so{.policy = *pol};
  kernels::Backend& be = kernels::cpu_backend();
  auto s = TrainState::from_loaded(**loaded, mode, kSeed);
  ASSERT_TRUE(s.ok());
  auto a = StreamExecutor::create(**s, kBatch, kSeq, so, be);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = StreamExecutor::create(initialized(mode, (*loaded)->config), (*loaded)->config, kSeed,
                                  kBatch, kSeq, so, be);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const std::vector<Batch> data = make_batches(4, (*loaded)->geometry.vocab, 3);
  for (int step = 0; step < 2; ++step) {
    double loss[2] = {0, 0};
    StreamExecutor* xs[2] = {a->get(), b->get()};
    for (int k = 0; k < 2; ++k) {
      xs[k]->begin_step(2);
      for (int m = 0; m < 2; ++m) {
        auto r = xs[k]->micro_batch(data[static_cast<std::size_t>(2 * step + m)].view());
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        loss[k] += r->mean_loss();
      }
      ASSERT_TRUE(xs[k]->finish_step({}, 1e-3, step + 1).ok());
    }
    EXPECT_EQ(loss[0], loss[1]) << "step " << step;
  }
  auto sa = TrainState::from_loaded(**loaded, mode, kSeed);
  auto sb = TrainState::from_loaded(**loaded, mode, kSeed);
  ASSERT_TRUE((*a)->store_to(**sa).ok());
  ASSERT_TRUE((*b)->store_to(**sb).ok());
  expect_same_state(**sa, **sb, "after 2 steps");
}

// `ferry bench train` hands one pinned arena from policy to policy: after an executor trained on
// it, release_arena + reinitialize give an arena that trains exactly like a fresh one (any state
// left over — moments, compensation, gradients, absmax, the streaming copy — would show).
TEST(HostArenaInit, ReleasedAndReinitializedArenaTrainsLikeAFreshOne) {
  const std::string dir = testing::temp_dir("arena_reinit");
  ASSERT_TRUE(write_builtin_model(dir, kSpec, kSeed).ok());
  auto loaded = model::load_model_f32(dir);
  ASSERT_TRUE(loaded.ok());
  const model::ModelConfig& config = (*loaded)->config;
  kernels::Backend& be = kernels::cpu_backend();
  const std::vector<Batch> data = make_batches(4, (*loaded)->geometry.vocab, 5);
  auto train = [&](StreamExecutor& x, std::vector<double>& losses) {
    for (int step = 0; step < 2; ++step) {
      x.begin_step(2);
      double loss = 0;
      for (int m = 0; m < 2; ++m) {
        auto r = x.micro_batch(data[static_cast<std::size_t>(2 * step + m)].view());
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        loss += r->mean_loss();
      }
      ASSERT_TRUE(x.finish_step({}, 1e-3, step + 1).ok());
      losses.push_back(loss);
    }
  };
  for (const OptimMode& mode :
       {OptimMode{.master = MasterWeights::kBf16Kahan, .states = OptimizerStates::k8Bit},
        OptimMode{.master = MasterWeights::kF32, .states = OptimizerStates::kF32}}) {
    const std::string what = describe(mode);
    auto first = parse_policy("every:2", kSpec.layers);
    auto second = parse_policy("host", kSpec.layers);
    ASSERT_TRUE(first.ok() && second.ok());
    auto x = StreamExecutor::create(initialized(mode, config), config, kSeed, kBatch, kSeq,
                                    {.policy = *first}, be);
    ASSERT_TRUE(x.ok()) << x.status().to_string();
    std::vector<double> ignored, reused_losses, fresh_losses;
    train(**x, ignored);
    std::unique_ptr<HostArena> arena = StreamExecutor::release_arena(std::move(*x));
    ASSERT_NE(arena, nullptr);
    const std::vector<model::ParamSpec> specs = model::param_specs(config);  // init keeps a ref
    BuiltinInit init(kSpec, kSeed, specs);
    arena->reinitialize([&](std::size_t i, float* out) { init.fill(i, out); });
    auto reused = StreamExecutor::create(std::move(arena), config, kSeed, kBatch, kSeq,
                                         {.policy = *second}, be);
    auto fresh = StreamExecutor::create(initialized(mode, config), config, kSeed, kBatch, kSeq,
                                        {.policy = *second}, be);
    ASSERT_TRUE(reused.ok() && fresh.ok());
    train(**reused, reused_losses);
    train(**fresh, fresh_losses);
    EXPECT_EQ(reused_losses, fresh_losses) << what;
    auto sa = TrainState::from_loaded(**loaded, mode, kSeed);
    auto sb = TrainState::from_loaded(**loaded, mode, kSeed);
    ASSERT_TRUE((*reused)->store_to(**sa).ok());
    ASSERT_TRUE((*fresh)->store_to(**sb).ok());
    expect_same_state(**sb, **sa, what);
  }
}

TEST(HostArenaInit, ExecutorRefusesAnArenaOfAnotherModel) {
  const std::string dir = testing::temp_dir("arena_init_other");
  ASSERT_TRUE(write_builtin_model(dir, kSpec, kSeed).ok());
  auto loaded = model::load_model_f32(dir);
  ASSERT_TRUE(loaded.ok());
  BuiltinModelSpec wider = kSpec;
  wider.intermediate = 64;
  auto other = model::parse_model_config_text(builtin_config_json(wider), "wider");
  ASSERT_TRUE(other.ok());
  auto pol = parse_policy("device", kSpec.layers);
  ASSERT_TRUE(pol.ok());
  auto x = StreamExecutor::create(initialized({}, (*loaded)->config), *other, kSeed, kBatch, kSeq,
                                  {.policy = *pol}, kernels::cpu_backend());
  ASSERT_FALSE(x.ok());
  EXPECT_NE(x.status().message().find("elements"), std::string::npos) << x.status().to_string();
}

}  // namespace
}  // namespace ferry::train::stream
