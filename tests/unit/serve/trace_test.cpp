// SPDX-License-Identifier: Apache-2.0
// Routing traces: record -> replay reproduces the routing and the output bits; forced routing from
// another trace changes them; the file format round-trips and rejects malformed lines; the
// synthetic generator meets its calibration targets; weights_for_ids equals the router's weights.
#include <set>

#include "kernels/backend.h"
#include "serve/builtin_model.h"
#include "serve/model_runner.h"
#include "serve/trace_synth.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

std::vector<GenerationRequest> two_requests() {
  std::vector<GenerationRequest> r(2);
  r[0].prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  r[1].prompt = {50, 40, 30};
  r[0].max_new_tokens = 6;
  r[1].max_new_tokens = 8;
  r[1].sampling = {.temperature = 1.0f, .seed = 9};
  return r;
}

EngineConfig paged_config(int cap) {
  EngineConfig cfg;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.pager.slots_per_layer = cap;
  cfg.max_batch_tokens = 4;
  cfg.max_running = 2;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  return cfg;
}

TEST(Trace, RecordThenReplayReproducesRoutingAndOutput) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const auto& m = *f.model;
  auto eng = Engine::create(m.geometry, m.params, paged_config(3));
  ASSERT_TRUE(eng.ok());
  TraceRecorder rec(m.geometry.experts, m.geometry.top_k);
  (*eng)->set_routing_hook(&rec);
  auto first = testing::run_engine(**eng, two_requests());
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  // 2 MoE layers (layer 1 is dense) x every computed position of both requests.
  EXPECT_EQ(rec.trace().routes.size(), std::size_t(2 * ((9 + 6 - 1) + (3 + 8 - 1))));

  const std::string path = ::testing::TempDir() + "/serve_trace_test.trace";
  ASSERT_TRUE(rec.trace().save(path).ok());
  auto loaded = RoutingTrace::load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->routes, rec.trace().routes);

  auto eng2 = Engine::create(m.geometry, m.params, paged_config(2));
  ASSERT_TRUE(eng2.ok());
  TraceReplayer rep(*loaded);
  TraceRecorder rec2(m.geometry.experts, m.geometry.top_k);
  // Replay, then record what the runner used (a second hook layer through a tiny chain).
  struct Chain : RoutingHook {
    RoutingHook *a, *b;
    Status on_route(const RouteKey& k, std::span<std::int32_t> ids) override {
      FERRY_TRY(a->on_route(k, ids));
      return b->on_route(k, ids);
    }
  } chain;
  chain.a = &rep;
  chain.b = &rec2;
  (*eng2)->set_routing_hook(&chain);
  auto second = testing::run_engine(**eng2, two_requests());
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(rep.forced(), rec.trace().routes.size());
  EXPECT_EQ(rec2.trace().routes, rec.trace().routes);
  EXPECT_EQ(second->tokens, first->tokens);
  for (const auto& [id, rows] : first->logits) {
    for (std::size_t i = 0; i < rows.size(); ++i) {
      EXPECT_TRUE(testing::same_bits(second->logits.at(id)[i], rows[i])) << id << " " << i;
    }
  }
}

TEST(Trace, ForcedRoutingChangesTheOutputAndIsStrict) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const auto& m = *f.model;
  auto eng = Engine::create(m.geometry, m.params, paged_config(2));
  ASSERT_TRUE(eng.ok());
  auto plain = testing::run_engine(**eng, two_requests());
  ASSERT_TRUE(plain.ok());
  // Every token of every request to experts {7, 6}, whatever the router says.
  RoutingTrace t{.experts = m.geometry.experts, .top_k = m.geometry.top_k};
  for (int r = 0; r < 2; ++r) {
    for (int p = 0; p < 20; ++p) {
      for (int l : {0, 2}) t.routes[{r, p, l}] = {7, 6};
    }
  }
  TraceReplayer rep(t);
  auto eng2 = Engine::create(m.geometry, m.params, paged_config(2));
  ASSERT_TRUE(eng2.ok());
  (*eng2)->set_routing_hook(&rep);
  auto forced = testing::run_engine(**eng2, two_requests());
  ASSERT_TRUE(forced.ok()) << forced.status().to_string();
  EXPECT_NE(forced->logits, plain->logits);
  // Only experts 6 and 7 were ever loaded.
  const ExpertPager& pg = *(*eng2)->experts().pager();
  for (int s = 0; s < pg.capacity(0); ++s) {
    EXPECT_TRUE(pg.expert_in(0, s) == 6 || pg.expert_in(0, s) == 7);
  }
  // Strict replay: a missing entry is an error, not a silent fallback.
  TraceReplayer empty(RoutingTrace{.experts = 8, .top_k = 2});
  auto eng3 = Engine::create(m.geometry, m.params, paged_config(2));
  ASSERT_TRUE(eng3.ok());
  (*eng3)->set_routing_hook(&empty);
  auto r3 = testing::run_engine(**eng3, two_requests());
  ASSERT_FALSE(r3.ok());
  EXPECT_EQ(r3.status().code(), StatusCode::kNotFound);
}

TEST(Trace, FileFormatRejectsMalformedInput) {
  EXPECT_TRUE(
      RoutingTrace::parse("ferry-routing-trace 1\nexperts 4 top_k 2\n0 0 0 1 3\n", "t").ok());
  EXPECT_FALSE(RoutingTrace::parse("nope\n", "t").ok());
  EXPECT_FALSE(
      RoutingTrace::parse("ferry-routing-trace 1\nexperts 4 top_k 2\n0 0 0 1 4\n", "t").ok());
  EXPECT_FALSE(
      RoutingTrace::parse("ferry-routing-trace 1\nexperts 4 top_k 2\n0 0 0 1 1\n", "t").ok());
  EXPECT_FALSE(
      RoutingTrace::parse("ferry-routing-trace 1\nexperts 4 top_k 2\n0 0 0 1\n", "t").ok());
  EXPECT_FALSE(
      RoutingTrace::parse("ferry-routing-trace 1\nexperts 4 top_k 2\n0 0 0 1 2 3\n", "t").ok());
}

TEST(TraceSynth, DecodeLocalityMeetsTheCalibrationTargets) {
  // Qwen3-30B-A3B routing geometry: 128 experts, top-8.
  SyntheticTraceSpec spec{.experts = 128,
                          .top_k = 8,
                          .moe_layers = {0, 1, 2},
                          .sessions = 4,
                          .prefill_tokens = 32,
                          .decode_tokens = 400,
                          .seed = 3};
  const RoutingTrace t = make_synthetic_trace(spec);
  for (int layer : spec.moe_layers) {
    const LocalityStats d = measure_locality(t, layer, 32 + 8, 32 + 400);
    EXPECT_NEAR(d.repeat_next, 0.45, 0.03) << "layer " << layer;
    EXPECT_NEAR(d.reuse_within8, 0.80, 0.03) << "layer " << layer;
    // Prefill bursts are more spread than decode.
    const LocalityStats p = measure_locality(t, layer, 8, 31);
    EXPECT_LT(p.reuse_within8, d.reuse_within8 - 0.1);
  }
  // Spread profile: uniform iid routing, so reuse is what chance gives (8/128 per pick).
  spec.spread = true;
  const RoutingTrace s = make_synthetic_trace(spec);
  const LocalityStats st = measure_locality(s, 0, 40, 432);
  EXPECT_LT(st.repeat_next, 0.12);
  EXPECT_LT(st.reuse_within8, 0.5);
  // Every entry is K distinct ids in range.
  for (const auto& [k, ids] : t.routes) {
    std::set<int> d(ids.begin(), ids.end());
    ASSERT_EQ(d.size(), 8u);
    ASSERT_GE(*d.begin(), 0);
    ASSERT_LT(*d.rbegin(), 128);
  }
}

TEST(TraceSynth, ZipfPopularityIsSkewed) {
  SyntheticTraceSpec spec{.experts = 64,
                          .top_k = 4,
                          .moe_layers = {0},
                          .sessions = 1,
                          .prefill_tokens = 0,
                          .decode_tokens = 4000,
                          .seed = 8};
  const RoutingTrace t = make_synthetic_trace(spec);
  std::vector<int> count(64, 0);
  for (const auto& [k, ids] : t.routes) {
    for (int e : ids) ++count[e];
  }
  std::sort(count.rbegin(), count.rend());
  int top8 = 0, total = 0;
  for (int i = 0; i < 64; ++i) (i < 8 ? top8 : total) += count[i];
  total += top8;
  EXPECT_GT(double(top8) / total, 8.0 / 64 * 1.5) << "the top 8 experts are not popular";
}

TEST(Trace, WeightsForIdsEqualTheRouterWeightsBitForBit) {
  Rng rng(4);
  for (bool renorm : {false, true}) {
    const int T = 17, E = 8, K = 3;
    std::vector<float> logits(T * E), probs(T * E), w(T * K), w2(K);
    std::vector<std::int32_t> ids(T * K);
    for (float& x : logits) x = static_cast<float>(rng.uniform() * 6 - 3);
    auto f32 = [](std::vector<float>& v, std::initializer_list<std::int64_t> d) {
      return TensorView::contiguous(v.data(), DType::kF32, Device::kCpu, d);
    };
    ASSERT_TRUE(
        kernels::cpu_backend()
            .router({.weights = f32(w, {T, K}),
                     .ids = TensorView::contiguous(ids.data(), DType::kI32, Device::kCpu, {T, K}),
                     .probs = f32(probs, {T, E}),
                     .logits = f32(logits, {T, E}),
                     .top_k = K,
                     .renormalize = renorm},
                    mem::Stream::host())
            .ok());
    for (int t = 0; t < T; ++t) {
      weights_for_ids(probs.data() + t * E, std::span<const std::int32_t>(ids.data() + t * K, K),
                      renorm, w2.data());
      EXPECT_EQ(std::memcmp(w2.data(), w.data() + t * K, K * sizeof(float)), 0) << t;
    }
  }
}

}  // namespace
}  // namespace ferry::serve
