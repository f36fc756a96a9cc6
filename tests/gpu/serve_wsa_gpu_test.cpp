// SPDX-License-Identifier: Apache-2.0
// MV-WSA's live resizes on the CUDA engine (issue #9, docs/serve_wsa.md "Engine changes"):
//   - KvCache::resize of a pool in GPU memory: a shrink below used blocks moves their K/V rows
//     (every layer) with device-to-device copies on the given stream, rewrites the tables, and
//     the rows read back equal what was written; the shared budget is charged the live blocks;
//     growing back works within the reserved backing; without a device copier it is unimplemented;
//   - the CUDA engine on the Qwen3-MoE fixture, resized between steps (Engine::resize_pools, the
//     call LiveSplit makes) at every step boundary -- expert caps up and down (top-k .. E, uneven)
//     and the KV pool shrunk to the blocks in use plus what waiting requests need (so used blocks
//     above the new size must move) and grown back -- gives the same token ids and the same
//     logits bits as a run without resizes, every request finishing by length, with blocks
//     really moved and experts really evicted;
//   - the engine bench's path (bench/serve/serve_split_engine_bench.cpp): a routing hook that
//     forces ahead, a resizable engine resized at every step boundary (caps and KV as above), with
//     device-side slot resolution (device_resolver.h) and CUDA graphs on, against the same engine
//     and resizes on the paged host path (device_resolve off): the same tokens, logits bits and
//     pager counters, the access observer (MV-WSA's stack distances: called from the resolver's
//     replay on the device path) sees the same (layer, routed ids) calls in the same order, so
//     equal stack-distance curves; device-resolved layer calls > 0 (also right after a shrink
//     that evicted), whole steps only, and host syncs = one per step plus one per MoE layer of
//     each host-path step (no per-layer hook sync: forced ahead).
// Skips, saying so, without a CUDA device.
#include <algorithm>
#include <cstring>
#include <iostream>
#include <vector>

#include "mem/stream_set.h"
#include "mem/transfer_engine.h"
#include "serve/engine.h"
#include "serve/kv_cache.h"
#include "serve/routing_trace.h"
#include "serve/wsa/stack_distance.h"
#include "tests/gpu/gpu_test_util.h"
#include "unit/serve/serve_test_util.h"

namespace ferry::serve {
namespace {

using ferry::testing::CudaTest;

class ServeWsaCuda : public CudaTest {};

// A value that names (layer, K/V, block content id, position in block, element).
float tag(int layer, int kv, int content, int pos, int i) {
  return float(layer * 100000 + kv * 50000 + content * 1000 + pos * 40 + i);
}

TEST_F(ServeWsaCuda, KvResizeMovesUsedRowsOnTheDevice) {
  model::DecoderGeometry geo;
  geo.layers = 3;
  geo.heads = 4;
  geo.kv_heads = 2;
  geo.head_dim = 8;
  const int bt = 4, GD = geo.kv_heads * geo.head_dim;
  auto probe = KvCache::create(geo, {.block_tokens = bt, .budget_bytes = 1 << 20});
  ASSERT_TRUE(probe.ok());
  const std::size_t bb = (*probe)->block_bytes();
  mem::MemoryBudget shared(mem::MemTier::kDevice, 64 * bb);
  auto kvr = KvCache::create(
      geo, {.block_tokens = bt, .budget_bytes = 12 * bb, .max_budget_bytes = 20 * bb}, &shared,
      mem::MemTier::kDevice);
  ASSERT_TRUE(kvr.ok()) << kvr.status().to_string();
  KvCache& kv = **kvr;
  EXPECT_EQ(shared.bytes_used(), 12 * bb);
  std::vector<BlockTable> t(3);
  ASSERT_TRUE(kv.reserve(t[0], 3 * bt).ok());  // blocks 0..2
  ASSERT_TRUE(kv.reserve(t[1], 3 * bt).ok());  // 3..5
  ASSERT_TRUE(kv.reserve(t[2], 5 * bt).ok());  // 6..10
  {
    std::vector<BlockTable*> all = {&t[0], &t[1], &t[2]};
    EXPECT_EQ(kv.resize(8, all).code(), StatusCode::kUnimplemented)
        << "a device pool without a copier must refuse";
  }
  auto ss = mem::StreamSet::create(Device::kCuda, 0);
  ASSERT_TRUE(ss.ok()) << ss.status().to_string();
  auto te = mem::cuda_transfer_engine(0);
  ASSERT_TRUE(te.ok()) << te.status().to_string();
  kv.set_device_copier(te->get(), &ss->compute());
  // Rows of tables 1 and 2 get values naming their (table, position); content id = table.
  auto write = [&](int s, int tokens) {
    for (int l = 0; l < geo.layers; ++l) {
      for (int p = 0; p < tokens; ++p) {
        std::vector<float> k(GD), v(GD);
        for (int i = 0; i < GD; ++i) k[i] = tag(l, 0, s, p, i), v[i] = tag(l, 1, s, p, i);
        ASSERT_EQ(ferry::testing::copy_to_device(kv.k_row(l, t[s], p), k.data(), GD * 4),
                  cudaSuccess);
        ASSERT_EQ(ferry::testing::copy_to_device(kv.v_row(l, t[s], p), v.data(), GD * 4),
                  cudaSuccess);
      }
    }
  };
  write(1, 3 * bt);
  write(2, 5 * bt);
  kv.release(t[0]);  // 0..2 free: table 2's blocks above 8 must move down
  std::vector<BlockTable*> live = {&t[1], &t[2]};
  ASSERT_TRUE(kv.resize(8, live).ok());
  EXPECT_EQ(kv.num_blocks(), 8);
  EXPECT_EQ(shared.bytes_used(), 8 * bb) << "the shared budget is charged the live blocks";
  EXPECT_EQ(kv.blocks_moved(), 3u);  // blocks 8, 9, 10
  for (const BlockTable* x : live) {
    for (std::int32_t b : x->blocks) EXPECT_LT(b, 8);
  }
  ASSERT_TRUE(ss->compute().synchronize().ok());
  auto check = [&](int s, int tokens) {
    int bad = 0;
    for (int l = 0; l < geo.layers; ++l) {
      for (int p = 0; p < tokens; ++p) {
        std::vector<float> k(GD), v(GD);
        ASSERT_EQ(cudaMemcpy(k.data(), kv.k_row(l, t[s], p), GD * 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpy(v.data(), kv.v_row(l, t[s], p), GD * 4, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        for (int i = 0; i < GD; ++i) {
          bad += k[i] != tag(l, 0, s, p, i);
          bad += v[i] != tag(l, 1, s, p, i);
        }
      }
    }
    EXPECT_EQ(bad, 0) << "table " << s << ": rows changed by the move";
  };
  check(1, 3 * bt);
  check(2, 5 * bt);
  // Below the blocks in use: refused, nothing changes.
  EXPECT_EQ(kv.resize(7, live).code(), StatusCode::kInvalidArgument);
  // Growing back within the reserved backing; the budget refuses more than it has.
  ASSERT_TRUE(kv.resize(20, live).ok());
  EXPECT_EQ(shared.bytes_used(), 20 * bb);
  mem::MemoryBudget small(mem::MemTier::kDevice, 10 * bb);
  auto kv2 = KvCache::create(
      geo, {.block_tokens = bt, .budget_bytes = 8 * bb, .max_budget_bytes = 20 * bb}, &small,
      mem::MemTier::kDevice);
  ASSERT_TRUE(kv2.ok()) << kv2.status().to_string();
  (*kv2)->set_device_copier(te->get(), &ss->compute());
  EXPECT_EQ((*kv2)->resize(12, {}).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ((*kv2)->num_blocks(), 8);
  check(1, 3 * bt);
  check(2, 5 * bt);
  ASSERT_TRUE(ss->compute().synchronize().ok());
}

// Six requests (one sampled) of 16..46 tokens: at 3 running and 8 tokens per step, prefill
// chunks mix with decodes, and requests finish at different steps (holes in the pool).
std::vector<GenerationRequest> six_requests(int vocab) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<std::int32_t> p;
    for (int j = 0; j < 6 + 5 * i; ++j) p.push_back((j * 37 + i * 11 + 5) % vocab);
    reqs.push_back({.prompt = p, .max_new_tokens = 10 + i});
  }
  reqs[2].sampling = {.temperature = 0.8f, .top_k = 20, .seed = 99};
  return reqs;
}

struct Outcome {
  testing::RunRecord rec;
  std::vector<FinishReason> finish;
};

Result<Outcome> serve(Engine& eng, const std::vector<GenerationRequest>& reqs,
                      const std::function<Status(int)>& at_step) {
  Outcome o;
  eng.set_logits_observer([&o](RequestId id, int, std::span<const float> row) {
    o.rec.logits[id].emplace_back(row.begin(), row.end());
  });
  std::vector<RequestId> ids;
  for (const auto& q : reqs) {
    FERRY_ASSIGN_OR_RETURN(RequestId id, eng.submit(q));
    ids.push_back(id);
  }
  for (int step = 0; !eng.idle(); ++step) {
    if (at_step) FERRY_TRY(at_step(step));
    FERRY_TRY(eng.step().status());
  }
  for (RequestId id : ids) {
    FERRY_ASSIGN_OR_RETURN(RequestOutput out, eng.take_output(id));
    o.rec.tokens[id] = out.tokens;
    o.finish.push_back(out.finish);
  }
  eng.set_logits_observer(nullptr);
  return o;
}

TEST_F(ServeWsaCuda, ResizingBetweenStepsKeepsTokensAndLogitsBits) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const int K = m.geometry.top_k, E = m.geometry.experts, L = m.geometry.layers;
  const auto reqs = six_requests(m.geometry.vocab);
  constexpr int kBlocks = 48;  // every request's whole reservation at once: admission never waits
  EngineConfig cfg;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.pager.slots_per_layer = K + 1;
  cfg.max_batch_tokens = 8;
  cfg.max_running = 3;
  cfg.kv.block_tokens = 4;
  auto probe = KvCache::create(m.geometry, {.block_tokens = 4, .budget_bytes = 1 << 20});
  ASSERT_TRUE(probe.ok());
  const std::size_t bb = (*probe)->block_bytes();
  cfg.kv.budget_bytes = kBlocks * bb;
  auto fixed = Engine::create(m.geometry, m.params, cfg, cuda());
  ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();
  auto want = serve(**fixed, reqs, {});
  ASSERT_TRUE(want.ok()) << want.status().to_string();

  EngineConfig live_cfg = cfg;
  live_cfg.pager.resizable = true;
  live_cfg.kv.max_budget_bytes = kBlocks * bb;
  auto live = Engine::create(m.geometry, m.params, live_cfg, cuda());
  ASSERT_TRUE(live.ok()) << live.status().to_string();
  Engine& eng = **live;
  // Expert caps cycle through these (top-k only, all resident, uneven); on odd steps the KV pool
  // shrinks to what is held plus what waiting requests need (the schedule stays the fixed
  // run's: every admission still fits), on even steps it grows back to the whole reservation.
  std::vector<std::vector<int>> caps_cycle = {std::vector<int>(std::size_t(L), K),
                                              std::vector<int>(std::size_t(L), E)};
  std::vector<int> uneven(std::size_t(L), K);
  for (int l = 0; l < L; l += 2) uneven[std::size_t(l)] = E - 1;
  caps_cycle.push_back(uneven);
  int shrinks = 0;
  std::size_t charge_errors = 0;
  auto got = serve(eng, reqs, [&](int step) -> Status {
    const KvDemandSample d = eng.kv_demand();
    int kv_blocks = kBlocks;
    if (step % 2 == 1) {
      kv_blocks = std::max({d.used + d.waiting_need, eng.max_request_blocks(), 1});
      shrinks += kv_blocks < eng.kv().num_blocks();
    }
    const std::size_t before = eng.device_budget().bytes_used();
    const int blocks_before = eng.kv().num_blocks();
    const auto& caps = caps_cycle[std::size_t(step) % caps_cycle.size()];
    const std::size_t slots_before = eng.experts().pager()->live_bytes();
    FERRY_TRY(eng.resize_pools(caps, kv_blocks));
    // The one device budget moves by exactly the pools' change.
    const std::ptrdiff_t want_delta =
        (std::ptrdiff_t(eng.kv().num_blocks()) - blocks_before) * std::ptrdiff_t(bb) +
        (std::ptrdiff_t(eng.experts().pager()->live_bytes()) - std::ptrdiff_t(slots_before));
    charge_errors +=
        std::ptrdiff_t(eng.device_budget().bytes_used()) - std::ptrdiff_t(before) != want_delta;
    return ok_status();
  });
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->rec.tokens, want->rec.tokens);
  std::size_t rows = 0;
  ASSERT_EQ(got->rec.logits.size(), want->rec.logits.size());
  for (const auto& [id, wrows] : want->rec.logits) {
    const auto& g = got->rec.logits.at(id);
    ASSERT_EQ(g.size(), wrows.size()) << "request " << id;
    for (std::size_t r = 0; r < wrows.size(); ++r, ++rows) {
      EXPECT_TRUE(testing::same_bits(g[r], wrows[r])) << "request " << id << " row " << r;
    }
  }
  for (FinishReason fr : got->finish) EXPECT_EQ(fr, FinishReason::kLength);
  EXPECT_EQ(charge_errors, 0u);
  const PagerCounters& pc = eng.experts().pager()->counters();
  EXPECT_GT(shrinks, 0);
  EXPECT_GT(eng.kv().blocks_moved(), 0u) << "no used block moved: the test lost its teeth";
  EXPECT_GT(pc.resize_evictions, 0u) << "no cap shrink evicted: the test lost its teeth";
  std::cout << "[serve_gpu] wsa resizes on cuda: " << eng.stats().pool_resizes << " resizes, "
            << shrinks << " kv shrinks, " << eng.kv().blocks_moved() << " blocks moved, "
            << pc.resize_evictions << " experts evicted, " << pc.bytes_moved
            << " slot bytes moved; " << rows << " logits rows bit-identical\n";
}

// Forces every (request, position, MoE layer) to K consecutive experts from a hash of (request,
// position / 2, layer): a pure function, so it forces ahead (as wsa::AgenticRouter does), with
// some reuse between neighbouring positions so slots hit.
class HashRouter : public RoutingHook {
 public:
  HashRouter(int experts, int top_k) : E_(experts), K_(top_k) {}
  bool forces_ahead() const override { return true; }
  Result<bool> forced_route(const RouteKey& key, std::span<std::int32_t> ids) override {
    FERRY_TRY(on_route(key, ids));
    return true;
  }
  Status on_route(const RouteKey& key, std::span<std::int32_t> ids) override {
    if (int(ids.size()) != K_) return invalid_argument("test: top-{} rows, got {}", K_, ids.size());
    const std::uint64_t h = (std::uint64_t(key.request) * 0x9E3779B97F4A7C15ull) ^
                            (std::uint64_t(key.position / 2) * 0xC2B2AE3D27D4EB4Full) ^
                            (std::uint64_t(key.layer) << 7);
    const int base = int((h >> 17) % std::uint64_t(E_));
    for (int k = 0; k < K_; ++k) ids[std::size_t(k)] = (base + k) % E_;  // distinct: K <= E
    return ok_status();
  }

 private:
  int E_, K_;
};

struct PathRun {
  Outcome out;
  std::vector<std::pair<int, std::vector<std::int32_t>>> calls;  // the access observer's
  std::vector<std::vector<double>> curves;                       // [layer] stack-distance misses
  std::uint64_t steps = 0, host_syncs = 0, device_resolved = 0, resolved_after_shrink = 0;
  PagerCounters pager;
  GraphStats graphs;
};

TEST_F(ServeWsaCuda, DeviceResolveWithResizesAndForcedRoutingKeepsTheHostPathsBits) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const int K = m.geometry.top_k, E = m.geometry.experts, L = m.geometry.layers;
  int moe = 0;
  for (bool x : m.geometry.layer_is_moe) moe += x;
  ASSERT_GT(moe, 0);
  ASSERT_GE(E, 3 * K) << "decode steps of 3 must fit the larger caps";
  const auto reqs = six_requests(m.geometry.vocab);
  constexpr int kBlocks = 48;
  auto probe = KvCache::create(m.geometry, {.block_tokens = 4, .budget_bytes = 1 << 20});
  ASSERT_TRUE(probe.ok());
  const std::size_t bb = (*probe)->block_bytes();
  // Caps at every step boundary: all resident, top-k, E - 1, 3 * K (decode steps of 3 running
  // still fit), half; the decode steps that fit every MoE layer's slots resolve on the device.
  const std::vector<int> cycle = {E, K, E - 1, 3 * K, std::max(K, E / 2)};
  auto run_path = [&](bool device_resolve) -> Result<PathRun> {
    EngineConfig cfg;
    cfg.pager.mode = ExpertMode::kPaged;
    cfg.pager.slots_per_layer = K + 1;
    cfg.pager.resizable = true;
    cfg.pager.device_resolve = device_resolve;
    cfg.max_batch_tokens = 8;
    cfg.max_running = 3;
    cfg.kv = {.block_tokens = 4, .budget_bytes = kBlocks * bb, .max_budget_bytes = kBlocks * bb};
    cfg.cuda_graphs = true;
    FERRY_ASSIGN_OR_RETURN(auto engp, Engine::create(m.geometry, m.params, cfg, cuda()));
    Engine& eng = *engp;
    PathRun r;
    std::vector<wsa::StackDistance> sd(static_cast<std::size_t>(L), wsa::StackDistance(E));
    std::vector<std::pair<int, int>> order;
    eng.experts().set_access_observer([&](int layer, std::span<const std::int32_t> ids) {
      r.calls.emplace_back(layer, std::vector<std::int32_t>(ids.begin(), ids.end()));
      std::vector<int> distinct;
      for (std::int32_t e : ids) {
        if (std::find(distinct.begin(), distinct.end(), e) == distinct.end()) distinct.push_back(e);
      }
      sd[std::size_t(layer)].access_set(distinct, order);
    });
    HashRouter router(E, K);
    eng.set_routing_hook(&router);
    std::uint64_t resolved_before = 0;
    bool evicted_last = false;
    FERRY_ASSIGN_OR_RETURN(
        r.out, serve(eng, reqs, [&](int step) -> Status {
          // The step before this boundary: device-resolved right after an evicting shrink?
          if (evicted_last && eng.experts().counters().device_resolved > resolved_before) {
            ++r.resolved_after_shrink;
          }
          int kv_blocks = kBlocks;
          if (step % 2 == 1) {  // shrink to what is held + what waiting requests need (as above)
            const KvDemandSample d = eng.kv_demand();
            kv_blocks = std::max({d.used + d.waiting_need, eng.max_request_blocks(), 1});
          }
          const std::uint64_t evictions = eng.experts().pager()->counters().resize_evictions;
          FERRY_TRY(eng.resize_pools(
              std::vector<int>(std::size_t(L), cycle[std::size_t(step) % cycle.size()]),
              kv_blocks));
          evicted_last = eng.experts().pager()->counters().resize_evictions > evictions;
          resolved_before = eng.experts().counters().device_resolved;
          return ok_status();
        }));
    eng.set_routing_hook(nullptr);
    eng.experts().set_access_observer(nullptr);
    for (const auto& d : sd) r.curves.push_back(d.miss_curve());
    r.steps = eng.stats().steps;
    r.host_syncs = eng.host_syncs();
    r.device_resolved = eng.experts().counters().device_resolved;
    r.pager = eng.experts().pager()->counters();
    r.graphs = eng.graph_stats();
    return r;
  };
  auto dev = run_path(true);
  auto host = run_path(false);
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  EXPECT_EQ(dev->out.rec.tokens, host->out.rec.tokens);
  std::size_t rows = 0;
  ASSERT_EQ(dev->out.rec.logits.size(), host->out.rec.logits.size());
  for (const auto& [id, hrows] : host->out.rec.logits) {
    const auto& g = dev->out.rec.logits.at(id);
    ASSERT_EQ(g.size(), hrows.size()) << "request " << id;
    for (std::size_t i = 0; i < hrows.size(); ++i, ++rows) {
      EXPECT_TRUE(testing::same_bits(g[i], hrows[i])) << "request " << id << " row " << i;
    }
  }
  for (FinishReason fr : dev->out.finish) EXPECT_EQ(fr, FinishReason::kLength);
  // The pager replayed the device's decisions: the host path's counters; the observer saw the
  // same calls (from the replay on the device path, during the layer on the host path).
  EXPECT_EQ(dev->pager.hits, host->pager.hits);
  EXPECT_EQ(dev->pager.misses, host->pager.misses);
  EXPECT_EQ(dev->pager.evictions, host->pager.evictions);
  EXPECT_EQ(dev->pager.resize_evictions, host->pager.resize_evictions);
  EXPECT_EQ(dev->calls, host->calls);
  EXPECT_EQ(dev->curves, host->curves);
  ASSERT_FALSE(dev->calls.empty());
  // Teeth: the device path ran (whole steps), also right after evicting shrinks; the host path
  // never did. Forced ahead: no hook syncs -- one per step, plus one per MoE layer of each
  // host-path step.
  EXPECT_GT(dev->device_resolved, 0u) << "device resolve stayed off: the test lost its teeth";
  EXPECT_EQ(dev->device_resolved % std::uint64_t(moe), 0u) << "whole steps only";
  EXPECT_GT(dev->resolved_after_shrink, 0u) << "no device step after an evicting shrink";
  EXPECT_GT(dev->pager.resize_evictions, 0u);
  EXPECT_EQ(host->device_resolved, 0u);
  ASSERT_EQ(dev->steps, host->steps);
  const std::uint64_t dev_steps = dev->device_resolved / std::uint64_t(moe);
  EXPECT_EQ(dev->host_syncs, dev->steps + std::uint64_t(moe) * (dev->steps - dev_steps));
  EXPECT_EQ(host->host_syncs, host->steps * (1 + std::uint64_t(moe)));
  EXPECT_EQ(dev->graphs.disabled_reason, "");
  std::cout << "[serve_gpu] wsa device resolve with resizes: " << dev_steps << " of " << dev->steps
            << " steps on the device (" << dev->resolved_after_shrink
            << " right after an evicting shrink), host syncs " << host->host_syncs << " -> "
            << dev->host_syncs << ", " << dev->graphs.replays << " graph replays, "
            << dev->pager.resize_evictions << " resize evictions, " << rows
            << " logits rows bit-identical\n";
}

}  // namespace
}  // namespace ferry::serve
