// SPDX-License-Identifier: Apache-2.0
// Clipping folded into AdamW's grad_scale equals reference global-norm clipping; decay flags;
// a non-finite gradient leaves everything untouched.
#include "train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "model/model_binding.h"
#include "test_util.h"
#include "train/builtin_model.h"
#include "train/rng.h"

namespace ferry::train {
namespace {

std::unique_ptr<TrainState> tiny_state(const std::string& tag) {
  const std::string dir = testing::temp_dir(tag);
  const TrainConfig c = testing::tiny_config(dir);
  EXPECT_TRUE(write_builtin_model(dir + "/m", c.builtin, 5).ok());
  auto loaded = model::load_model_f32(dir + "/m");
  EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
  auto s = TrainState::from_loaded(**loaded);
  EXPECT_TRUE(s.ok());
  return std::move(s).value();
}

void fill_grads(TrainState& s, std::uint64_t seed, double scale) {
  Rng r(seed);
  for (auto& [name, g] : s.grads->named) {
    float* p = g.as<float>();
    for (std::int64_t i = 0; i < g.numel(); ++i) p[i] = static_cast<float>(r.normal() * scale);
  }
}

TEST(Optimizer, DecayFlags) {
  EXPECT_TRUE(decays("model.layers.0.mlp.up_proj.weight"));
  EXPECT_TRUE(decays("model.embed_tokens.weight"));
  EXPECT_FALSE(decays("model.layers.0.input_layernorm.weight"));
  EXPECT_FALSE(decays("model.layers.0.self_attn.q_norm.weight"));
  EXPECT_FALSE(decays("model.norm.weight"));
  EXPECT_FALSE(decays("model.layers.0.self_attn.q_proj.bias"));
}

TEST(Optimizer, ClipScaleMatchesReferenceGlobalNormClipping) {
  auto a = tiny_state("clip_a");
  auto b = tiny_state("clip_b");
  const int accum = 2;
  fill_grads(*a, 11, 0.5);
  fill_grads(*b, 11, 0.5);
  // Reference: ||G|| over the concatenation of every gradient, G = sum / accum, in f64.
  double ss = 0.0;
  for (const auto& [name, g] : a->grads->named) {
    const float* p = g.as<float>();
    for (std::int64_t i = 0; i < g.numel(); ++i) ss += double(p[i]) * double(p[i]);
  }
  const double ref_norm = std::sqrt(ss) / accum;
  const double max_norm = 1.0;
  ASSERT_GT(ref_norm, max_norm);  // the test must actually clip
  const double ref_clip = max_norm / (ref_norm + 1e-6);

  AdamWConfig cfg;
  cfg.max_grad_norm = max_norm;
  auto& be = kernels::cpu_backend();
  auto o = optimizer_step(*a, cfg, 1e-2, 1, accum, be);
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->applied);
  // sum_squares returns f32 per parameter: relative error ~1e-7 per term.
  EXPECT_NEAR(o->grad_norm, ref_norm, 1e-6 * ref_norm);
  EXPECT_NEAR(o->clip, ref_clip, 1e-6 * ref_clip);

  // Reference path: clip the gradients explicitly, then AdamW with grad_scale 1.
  for (auto& [name, g] : b->grads->named) {
    float* p = g.as<float>();
    for (std::int64_t i = 0; i < g.numel(); ++i) {
      p[i] = static_cast<float>(double(p[i]) / accum * ref_clip);
    }
  }
  cfg.max_grad_norm = 0.0;  // already clipped
  auto ob = optimizer_step(*b, cfg, 1e-2, 1, 1, be);
  ASSERT_TRUE(ob.ok());
  EXPECT_NEAR(ob->grad_norm, max_norm, 1e-5);
  // Step 1 of Adam moves each weight by ~lr * sign(g): the two paths differ only by the f32
  // rounding of g * scale (relative 1e-7), far below 1e-6 * lr.
  for (std::size_t i = 0; i < a->num_params(); ++i) {
    const float* pa = a->master->named[i].second.as<float>();
    const float* pb = b->master->named[i].second.as<float>();
    for (std::int64_t k = 0; k < a->master->named[i].second.numel(); ++k) {
      ASSERT_NEAR(pa[k], pb[k], 1e-6) << a->master->named[i].first << "[" << k << "]";
    }
  }
}

TEST(Optimizer, NonFiniteGradientSkipsTheUpdate) {
  auto s = tiny_state("nan");
  fill_grads(*s, 3, 0.1);
  s->grads->named[2].second.as<float>()[5] = std::nanf("");
  std::vector<float> before(s->master->bufs[0]);
  auto o = optimizer_step(*s, {}, 1e-2, 1, 1, kernels::cpu_backend());
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->applied);
  EXPECT_FALSE(std::isfinite(o->grad_norm));
  EXPECT_EQ(0, std::memcmp(before.data(), s->master->bufs[0].data(), before.size() * 4));
  for (float m : s->m->bufs[0]) ASSERT_EQ(m, 0.0f);
}

}  // namespace
}  // namespace ferry::train
