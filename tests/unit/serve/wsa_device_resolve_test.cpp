// SPDX-License-Identifier: Apache-2.0
// MV-WSA's engine bench path (bench/serve/serve_split_engine_bench.cpp) on the CPU engine: agentic
// sessions re-sending their history, routed by wsa::AgenticRouter forced ahead, through a
// resizable paged engine whose expert caps change at every step boundary (Engine::resize_pools,
// LiveSplit's call: all resident, top-k only, uneven both ways), with device-side slot resolution
// (its CPU twin, device_resolver.h) on:
//   - the same tokens and logits bits as the same engine on the host path (device_resolve off),
//     as the per-layer hook path (AgenticRouter ahead = false) and as a fixed split (not
//     resizable, 4 slots per layer); every turn finishes by length;
//   - the access observer (what feeds MV-WSA's stack distances) sees the same (layer, routed ids)
//     calls in the same order on both paths, so per-layer stack-distance histograms and miss
//     curves are equal;
//   - the twin really ran (device-resolved layer calls > 0, also in steps right after a shrink
//     that evicted: the refill from the pager after a resize is exercised) and shrinks really
//     evicted; the host path resolved nothing on the device.
// AgenticRouter: an unbound request and a position past its session are statuses.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "serve/builtin_model.h"
#include "serve/wsa/agentic_router.h"
#include "serve/wsa/agentic_workload.h"
#include "serve/wsa/stack_distance.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

constexpr int kBlockTokens = 4;

// Four sessions of three turns over the tiny built-in model's 2 MoE layers x 8 experts, top-2.
wsa::AgenticSpec spec() {
  return {.sessions = 4,
          .turns = 3,
          .prefix_tokens = 24,
          .user_min = 3,
          .user_max = 8,
          .output_min = 8,
          .output_max = 16,
          .moe_layers = 2,
          .experts = 8,
          .top_k = 2,
          .seed = 11};
}

struct Outcome {
  std::map<std::pair<int, int>, std::vector<std::int32_t>> tokens;
  std::map<std::pair<int, int>, std::vector<std::vector<float>>> logits;
  std::vector<std::pair<int, std::vector<std::int32_t>>> calls;  // the access observer's
  std::vector<std::vector<double>> hist, curve;                  // [layer] stack distances
  std::uint64_t device_resolved = 0, resolved_after_evicting_shrink = 0;
  PagerCounters pager;
  int finished_by_length = 0, turns = 0;
};

// Runs the workload; before each step after the first, caps_at(step) (if any) resizes the
// expert caps through Engine::resize_pools.
Result<Outcome> run(const BuiltinModel& m, const wsa::AgenticWorkload& w, const EngineConfig& cfg,
                    bool ahead, const std::function<std::vector<int>(int)>& caps_at) {
  FERRY_ASSIGN_OR_RETURN(auto engp, Engine::create(m.geometry, m.params, cfg));
  Engine& eng = *engp;
  const int vocab = m.geometry.vocab, E = m.geometry.experts;
  Outcome out;
  std::vector<wsa::StackDistance> sd(std::size_t(m.geometry.layers), wsa::StackDistance(E));
  std::vector<std::pair<int, int>> order;
  // As LiveSplit feeds its stack distances: one set of distinct experts per layer call.
  eng.experts().set_access_observer([&](int layer, std::span<const std::int32_t> ids) {
    out.calls.emplace_back(layer, std::vector<std::int32_t>(ids.begin(), ids.end()));
    std::vector<int> distinct;
    for (std::int32_t e : ids) {
      if (std::find(distinct.begin(), distinct.end(), e) == distinct.end()) distinct.push_back(e);
    }
    sd[std::size_t(layer)].access_set(distinct, order);
  });
  wsa::AgenticRouter router(w, ahead);
  eng.set_routing_hook(&router);
  std::map<RequestId, std::pair<int, int>> turn_of;
  std::map<int, std::vector<std::int32_t>> prompt_of;
  eng.set_logits_observer([&](RequestId id, int, std::span<const float> row) {
    out.logits[turn_of.at(id)].emplace_back(row.begin(), row.end());
  });
  Status failed = ok_status();
  auto submit = [&](int s, int t, std::vector<std::int32_t> prompt) {
    prompt_of[s] = prompt;
    auto id = eng.submit(
        {.prompt = std::move(prompt), .max_new_tokens = w.turns(s)[std::size_t(t)].output});
    if (!id.ok()) {
      failed = id.status();
      return;
    }
    turn_of[*id] = {s, t};
    router.bind(*id, s);
  };
  for (int s = 0; s < w.sessions(); ++s) submit(s, 0, w.turn_prompt(s, 0, vocab));
  for (int step = 0; failed.ok() && !eng.idle(); ++step) {
    std::uint64_t evicted_before = 0;
    if (caps_at && step > 0) {
      evicted_before = eng.experts().pager()->counters().resize_evictions;
      FERRY_TRY(eng.resize_pools(caps_at(step), 0));
    }
    const bool evicting_shrink =
        caps_at && step > 0 && eng.experts().pager()->counters().resize_evictions > evicted_before;
    const std::uint64_t resolved = eng.experts().counters().device_resolved;
    FERRY_ASSIGN_OR_RETURN(std::vector<TokenEvent> ev, eng.step());
    if (evicting_shrink && eng.experts().counters().device_resolved > resolved) {
      ++out.resolved_after_evicting_shrink;
    }
    for (const TokenEvent& e : ev) {
      if (e.finish == FinishReason::kNone) continue;
      ++out.turns;
      out.finished_by_length += e.finish == FinishReason::kLength;
      FERRY_ASSIGN_OR_RETURN(RequestOutput o, eng.take_output(e.id));
      const auto [s, t] = turn_of.at(e.id);
      out.tokens[{s, t}] = o.tokens;
      if (t + 1 >= static_cast<int>(w.turns(s).size())) continue;
      submit(s, t + 1, w.next_turn_prompt(s, t, prompt_of[s], o.tokens, vocab));
    }
  }
  FERRY_TRY(failed);
  eng.set_logits_observer(nullptr);
  eng.set_routing_hook(nullptr);
  eng.experts().set_access_observer(nullptr);
  for (const auto& d : sd) {
    out.hist.push_back(d.hist());
    out.curve.push_back(d.miss_curve());
  }
  out.device_resolved = eng.experts().counters().device_resolved;
  out.pager = eng.experts().pager()->counters();
  return out;
}

EngineConfig paged(bool resizable, bool device_resolve) {
  EngineConfig cfg;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.pager.slots_per_layer = 4;
  cfg.pager.resizable = resizable;
  cfg.pager.device_resolve = device_resolve;
  cfg.max_batch_tokens = 12;
  cfg.max_running = 3;
  // Room for every session's whole context at once: admission never waits, no preemption, so
  // every engine runs the same batches and only where experts live differs.
  cfg.kv = {.block_tokens = kBlockTokens, .budget_bytes = 8 << 20};
  return cfg;
}

void expect_same(const Outcome& got, const Outcome& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  std::size_t rows = 0;
  for (const auto& [turn, wrows] : want.logits) {
    const auto& g = got.logits.at(turn);
    ASSERT_EQ(g.size(), wrows.size()) << what;
    for (std::size_t r = 0; r < wrows.size(); ++r, ++rows) {
      EXPECT_TRUE(testing::same_bits(g[r], wrows[r]))
          << what << ": session " << turn.first << " turn " << turn.second << " row " << r;
    }
  }
  EXPECT_GT(rows, 0u) << what;
}

TEST(WsaDeviceResolve, ResizableEngineWithForcedAheadRoutingKeepsTheHostPathsBitsAndAccesses) {
  auto m = testing::tiny_builtin_moe(31);
  ASSERT_TRUE(m);
  const int K = m->geometry.top_k, E = m->geometry.experts;
  ASSERT_EQ(m->geometry.layers, 2);
  const wsa::AgenticWorkload w(spec());
  // Caps at every step boundary: all resident, top-k, uneven one way and the other, half.
  const std::vector<std::vector<int>> cycle = {
      {E, E}, {K, K}, {E - 1, K + 1}, {K + 1, E - 1}, {E / 2, E / 2}};
  auto caps_at = [&](int step) { return cycle[std::size_t(step) % cycle.size()]; };

  auto dev = run(*m, w, paged(true, true), /*ahead=*/true, caps_at);
  auto host = run(*m, w, paged(true, false), /*ahead=*/true, caps_at);
  auto per_layer = run(*m, w, paged(true, true), /*ahead=*/false, caps_at);
  auto fixed = run(*m, w, paged(false, false), /*ahead=*/false, {});
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  ASSERT_TRUE(per_layer.ok()) << per_layer.status().to_string();
  ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();

  const int turns = 4 * 3;
  for (const Outcome* o : {&*dev, &*host, &*per_layer, &*fixed}) {
    EXPECT_EQ(o->turns, turns);
    EXPECT_EQ(o->finished_by_length, turns);
  }
  expect_same(*dev, *host, "device resolve vs host path (both resized, forced ahead)");
  expect_same(*dev, *per_layer, "forced ahead vs per-layer hook (both resized, device resolve)");
  expect_same(*dev, *fixed, "resized + device resolve vs a fixed split");

  // The access observer: the same calls in the same order, so the same stack distances.
  EXPECT_EQ(dev->calls, host->calls);
  EXPECT_EQ(dev->calls, per_layer->calls);
  EXPECT_EQ(dev->hist, host->hist);
  EXPECT_EQ(dev->curve, host->curve);
  ASSERT_FALSE(dev->calls.empty());
  // The pager mirrored the twin's decisions: the host path's counters.
  EXPECT_EQ(dev->pager.hits, host->pager.hits);
  EXPECT_EQ(dev->pager.misses, host->pager.misses);
  EXPECT_EQ(dev->pager.evictions, host->pager.evictions);
  EXPECT_EQ(dev->pager.resize_evictions, host->pager.resize_evictions);

  // Teeth: the twin ran, also right after shrinks that evicted; the host path never did.
  EXPECT_GT(dev->device_resolved, 0u);
  EXPECT_GT(per_layer->device_resolved, 0u);
  EXPECT_EQ(host->device_resolved, 0u);
  EXPECT_GT(dev->resolved_after_evicting_shrink, 0u)
      << "no device-resolved step followed an evicting shrink: the refill is not exercised";
  EXPECT_GT(dev->pager.resize_evictions, 0u);
  EXPECT_GT(dev->pager.resizes, 0u);
  std::printf(
      "wsa device resolve: %zu layer calls observed, %llu device-resolved (%llu steps right after "
      "an evicting shrink), %llu resizes, %llu resize evictions, hits %llu misses %llu\n",
      dev->calls.size(), static_cast<unsigned long long>(dev->device_resolved),
      static_cast<unsigned long long>(dev->resolved_after_evicting_shrink),
      static_cast<unsigned long long>(dev->pager.resizes),
      static_cast<unsigned long long>(dev->pager.resize_evictions),
      static_cast<unsigned long long>(dev->pager.hits),
      static_cast<unsigned long long>(dev->pager.misses));
}

TEST(WsaDeviceResolve, AgenticRouterRefusesWhatItCannotRoute) {
  const wsa::AgenticWorkload w(spec());
  wsa::AgenticRouter router(w);
  EXPECT_TRUE(router.forces_ahead());
  EXPECT_FALSE(wsa::AgenticRouter(w, false).forces_ahead());
  std::vector<std::int32_t> ids(2, -1);
  auto unbound = router.forced_route({.request = 5, .position = 0, .layer = 0}, ids);
  EXPECT_EQ(unbound.status().code(), StatusCode::kNotFound);
  router.bind(5, 1);
  auto r = router.forced_route({.request = 5, .position = 3, .layer = 1}, ids);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(*r);
  const auto want = w.route(1, 3, 1);
  EXPECT_EQ(ids[0], want[0]);
  EXPECT_EQ(ids[1], want[1]);
  std::vector<std::int32_t> hooked(2, -1);
  ASSERT_TRUE(router.on_route({.request = 5, .position = 3, .layer = 1}, hooked).ok());
  EXPECT_EQ(hooked, ids);
  const int past = w.session_tokens(1);
  EXPECT_EQ(router.forced_route({.request = 5, .position = past, .layer = 0}, ids).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(router.forced_route({.request = 5, .position = 0, .layer = 2}, ids).status().code(),
            StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace ferry::serve
