// SPDX-License-Identifier: Apache-2.0
// Routing traces: record -> replay reproduces the routing and the output bits; forced routing from
// another trace changes them; the file format round-trips and rejects malformed lines; the
// synthetic generator meets its calibration targets; weights_for_ids equals the router's weights.
#include <cstring>
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

// Forced routing asked ahead of the step (TraceReplayer::forces_ahead: fill_forced_routing, then
// apply_forced_rows per MoE layer) gives the per-layer hook path's routing and bits, in every
// mode, with rows equal to the router's (weights kept), changed rows (new weights) and rows the
// replay leaves to the router (non-strict).
TEST(Trace, ForcedAheadEqualsThePerLayerHook) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const auto& m = *f.model;
  auto eng = Engine::create(m.geometry, m.params, paged_config(3));
  ASSERT_TRUE(eng.ok());
  TraceRecorder rec(m.geometry.experts, m.geometry.top_k);
  (*eng)->set_routing_hook(&rec);
  ASSERT_TRUE(testing::run_engine(**eng, two_requests()).ok());
  const RoutingTrace varied = testing::varied_trace(rec.trace());
  for (ExpertMode mode : {ExpertMode::kResident, ExpertMode::kStatic, ExpertMode::kPaged}) {
    EngineConfig cfg = paged_config(2);
    cfg.pager.mode = mode;
    testing::PerLayerReplayer per_layer(varied, /*strict=*/false);
    TraceReplayer ahead(varied, /*strict=*/false);
    ASSERT_FALSE(per_layer.forces_ahead());
    ASSERT_TRUE(ahead.forces_ahead());
    auto e1 = Engine::create(m.geometry, m.params, cfg);
    auto e2 = Engine::create(m.geometry, m.params, cfg);
    ASSERT_TRUE(e1.ok() && e2.ok());
    (*e1)->set_routing_hook(&per_layer);
    (*e2)->set_routing_hook(&ahead);
    auto a = testing::run_engine(**e1, two_requests());
    auto b = testing::run_engine(**e2, two_requests());
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
    EXPECT_EQ(ahead.forced(), per_layer.rep.forced()) << to_string(mode);
    EXPECT_GT(ahead.forced(), 0u);
    EXPECT_EQ(b->tokens, a->tokens) << to_string(mode);
    for (const auto& [id, rows] : a->logits) {
      ASSERT_EQ(b->logits.at(id).size(), rows.size());
      for (std::size_t i = 0; i < rows.size(); ++i) {
        EXPECT_TRUE(testing::same_bits(b->logits.at(id)[i], rows[i]))
            << to_string(mode) << " request " << id << " row " << i;
      }
    }
  }
  // The varied trace really changes the output (the +1 rows), so the identity is not vacuous.
  auto plain_eng = Engine::create(m.geometry, m.params, paged_config(2));
  ASSERT_TRUE(plain_eng.ok());
  TraceReplayer ahead(varied, false);
  (*plain_eng)->set_routing_hook(&ahead);
  auto forced = testing::run_engine(**plain_eng, two_requests());
  auto plain_eng2 = Engine::create(m.geometry, m.params, paged_config(2));
  ASSERT_TRUE(plain_eng2.ok());
  auto plain = testing::run_engine(**plain_eng2, two_requests());
  ASSERT_TRUE(forced.ok() && plain.ok());
  EXPECT_NE(forced->logits, plain->logits);
}

TEST(Trace, FillForcedRoutingChecksLikeThePerLayerHook) {
  model::DecoderGeometry geo;
  geo.layers = 3;
  geo.layer_is_moe = {true, false, true};
  geo.experts = 4;
  geo.top_k = 2;
  BlockTable table;
  StepBatch b;
  b.ids = {1, 2};
  b.positions = {5, 6};
  b.seq_of = {0, 0};
  b.tables = {&table};
  b.requests = {7};
  RoutingTrace t{.experts = 4, .top_k = 2};
  t.routes[{7, 5, 0}] = {3, 1};
  t.routes[{7, 6, 0}] = {0, 2};
  t.routes[{7, 5, 2}] = {2, 3};
  std::vector<std::int32_t> forced(2 * 2 * 2, 99);
  {
    TraceReplayer strict(t);
    const Status s = fill_forced_routing(strict, b, geo, forced.data());
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();  // (7, 6, 2) is missing
  }
  TraceReplayer loose(t, false);
  ASSERT_TRUE(fill_forced_routing(loose, b, geo, forced.data()).ok());
  // MoE layers 0 and 2 are rows 0 and 1 of [moe layers, T, K]; a missing entry is -1s.
  EXPECT_EQ(forced, (std::vector<std::int32_t>{3, 1, 0, 2, 2, 3, -1, -1}));
  EXPECT_EQ(loose.forced(), 3u);
  struct Bad : RoutingHook {
    std::vector<std::int32_t> ids;
    Status on_route(const RouteKey&, std::span<std::int32_t>) override { return ok_status(); }
    bool forces_ahead() const override { return true; }
    Result<bool> forced_route(const RouteKey&, std::span<std::int32_t> out) override {
      std::copy(ids.begin(), ids.end(), out.begin());
      return true;
    }
  } bad;
  bad.ids = {1, 4};
  EXPECT_EQ(fill_forced_routing(bad, b, geo, forced.data()).code(), StatusCode::kInvalidArgument);
  bad.ids = {2, 2};
  EXPECT_EQ(fill_forced_routing(bad, b, geo, forced.data()).code(), StatusCode::kInvalidArgument);
}

// apply_forced_rows (the twin of the CUDA forced_routing kernel) equals apply_routing_hook on
// the same rows: kept, equal and replaced rows, with and without renormalisation.
TEST(Trace, ApplyForcedRowsEqualsTheHookPath) {
  const int T = 6, K = 3, E = 9;
  std::vector<float> probs(T * E);
  std::uint32_t x = 12345;
  for (float& p : probs) {
    x = x * 1664525u + 1013904223u;
    p = float(x >> 8) / float(1u << 24);
  }
  std::vector<std::int32_t> router = {0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 1, 3, 5, 2, 4, 6};
  std::vector<float> rw(T * K);
  for (int i = 0; i < T * K; ++i) rw[i] = 0.25f + float(i);  // recognisable router weights
  std::vector<std::int32_t> forced = {-1, -1, -1, 3, 4, 5, 8, 0, 1, 0, 7, 6, 1, 3, 5, 5, 4, 6};
  model::DecoderGeometry geo;
  geo.layers = 1;
  geo.layer_is_moe = {true};
  geo.experts = E;
  geo.top_k = K;
  for (bool renorm : {false, true}) {
    geo.renormalize_topk = renorm;
    RoutingTrace t{.experts = E, .top_k = K};
    BlockTable table;
    StepBatch b;
    for (int i = 0; i < T; ++i) {
      b.ids.push_back(0);
      b.positions.push_back(i);
      b.seq_of.push_back(0);
      if (forced[i * K] >= 0) {
        t.routes[{0, i, 0}] = {forced.begin() + i * K, forced.begin() + (i + 1) * K};
      }
    }
    b.tables = {&table};
    b.requests = {0};
    std::vector<std::int32_t> ids_a = router, ids_b = router, before(K);
    std::vector<float> w_a = rw, w_b = rw;
    TraceReplayer rep(t, false);
    ASSERT_TRUE(
        apply_routing_hook(rep, b, 0, geo, ids_a.data(), probs.data(), w_a.data(), before.data())
            .ok());
    apply_forced_rows(forced.data(), T, K, E, renorm, probs.data(), ids_b.data(), w_b.data());
    EXPECT_EQ(ids_a, ids_b);
    EXPECT_EQ(std::memcmp(w_a.data(), w_b.data(), w_a.size() * 4), 0) << renorm;
    EXPECT_EQ(w_b[3], rw[3]);  // row 1 equals the router's choice: its weights stay
    EXPECT_NE(w_b[6], rw[6]);  // row 2 was replaced
  }
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
