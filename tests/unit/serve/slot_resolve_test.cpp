// SPDX-License-Identifier: Apache-2.0
// Device-side slot resolution's CPU twin (serve/slot_resolve.h) against the host pager:
//   - property: on seeded random routing sequences (locality-biased, T*K <= cap - hot per call),
//     many seeds, caps and hot sets, one layer's twin state after every call equals the pager
//     under LRU, LFU and LFRU (half-lives 1, 4, 7, 10): the expert of every slot, the stamps,
//     the use counts, LFRU's scores (bits) and their ticks, the tick, every expert's slot, the
//     table's pointers, and the call's hits / misses / evictions, misses in the pager's copy
//     order; host-only calls and resizes in between are followed by a refill from the pager
//     (the engine's resync) and the twin goes on agreeing;
//   - the miss-copy twin copies exactly the missed blocks into their slots;
//   - the CPU engine with the twin (PagerConfig::device_resolve) gives the bits and the pager
//     counters of the host path, on the HF MoE fixtures, under LRU, LFU and LFRU; every policy
//     without miss placement or bypass gets a resolver; a pager changed behind the resolver's
//     back is caught by the replay's check;
//   - one sequence where LRU, LFU and LFRU evict three different experts.
#include <algorithm>
#include <cstring>

#include "serve/builtin_model.h"
#include "serve/engine.h"
#include "serve/expert_pager.h"
#include "serve/model_runner.h"
#include "serve/sampler.h"
#include "serve/slot_resolve.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

std::unique_ptr<BuiltinModel> model_with(int E, int K) {
  auto m = make_builtin_moe({.vocab = 64,
                             .layers = 1,
                             .hidden = 16,
                             .heads = 2,
                             .kv_heads = 1,
                             .head_dim = 8,
                             .experts = E,
                             .top_k = K,
                             .expert_width = 8},
                            3);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

// T rows of K distinct experts; each pick repeats a recent expert with probability 1/2.
std::vector<std::int32_t> random_routing(Rng& rng, int E, int K, int T,
                                         std::vector<std::int32_t>& recent) {
  std::vector<std::int32_t> ids;
  for (int t = 0; t < T; ++t) {
    std::vector<std::int32_t> row;
    while (static_cast<int>(row.size()) < K) {
      std::int32_t e = static_cast<std::int32_t>(rng.next() % std::uint64_t(E));
      if (!recent.empty() && rng.next() % 2 == 0) e = recent[rng.next() % recent.size()];
      if (std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
    }
    ids.insert(ids.end(), row.begin(), row.end());
    recent.insert(recent.end(), row.begin(), row.end());
    if (recent.size() > std::size_t(3 * K)) recent.erase(recent.begin(), recent.begin() + K);
  }
  return ids;
}

std::vector<std::int32_t> distinct_of(const std::vector<std::int32_t>& ids) {
  std::vector<std::int32_t> d;
  for (std::int32_t e : ids) {
    if (std::find(d.begin(), d.end(), e) == d.end()) d.push_back(e);
  }
  return d;
}

struct Twin {
  std::vector<std::int32_t> state, log;
  std::vector<const void*> table;
};

// Compares the twin's state with the pager's layer 0; returns the first difference, or "".
std::string diff(const Twin& tw, const ExpertPager& p, const ExpertStore& store, int E, int M) {
  const SlotStateView st{const_cast<std::int32_t*>(tw.state.data()), E, M};
  if (st.cap() != p.capacity(0)) return "cap";
  if (st.tick() != p.tick(0)) return "tick";
  for (int s = 0; s < M; ++s) {
    const int want = s < p.capacity(0) ? p.expert_in(0, s) : -1;
    if (st.expert_in()[s] != want)
      return fmt::format("slot {} holds {} not {}", s, st.expert_in()[s], want);
    if (want >= 0 && st.stamp()[s] != p.last_use(0, s)) return fmt::format("stamp of slot {}", s);
    if (want >= 0 && st.uses()[s] != p.uses(0, s)) return fmt::format("uses of slot {}", s);
    if (want >= 0 && p.policy() == EvictionPolicy::kLfru) {
      const SlotMeta& m = p.meta(0, s);
      if (st.score_at()[s] != m.score_at) return fmt::format("score tick of slot {}", s);
      if (std::memcmp(&st.score()[s], &m.score, sizeof(double)) != 0) {
        return fmt::format("score of slot {}: {:a} not {:a}", s, st.score()[s], m.score);
      }
    }
  }
  for (int e = 0; e < E; ++e) {
    const int s = st.slot_of()[e];
    if ((s >= 0) != p.is_resident(0, e)) return fmt::format("residency of expert {}", e);
    const void* want =
        s >= 0 ? store.ref_in(p.slot_base(0) + std::size_t(s) * store.expert_bytes()).down
               : nullptr;
    if (tw.table[std::size_t(2 * E + e)] != want) return fmt::format("table of expert {}", e);
  }
  return "";
}

class SlotResolveTwin : public ::testing::TestWithParam<EvictionPolicy> {};

TEST_P(SlotResolveTwin, DecisionsEqualTheHostPagerOnRandomRouting) {
  const EvictionPolicy policy = GetParam();
  int calls = 0, misses = 0, evictions = 0, refills = 0;
  for (const auto& [E, K] : {std::pair{8, 2}, std::pair{16, 4}, std::pair{32, 8}}) {
    auto m = model_with(E, K);
    ASSERT_TRUE(m);
    auto store = ExpertStore::create(m->geometry, m->params);
    ASSERT_TRUE(store.ok());
    const ExpertStore& st = **store;
    for (std::uint64_t seed = 1; seed <= 12; ++seed) {
      Rng rng(seed * 7919);
      const int hot_n = int(seed % 3);  // 0, 1 or 2 pinned experts
      const int cap = std::min(E, K + hot_n + int(rng.next() % std::uint64_t(E)));
      std::vector<int> hot;
      for (int h = 0; h < hot_n; ++h) hot.push_back((h * 5 + int(seed)) % E);
      std::sort(hot.begin(), hot.end());
      hot.erase(std::unique(hot.begin(), hot.end()), hot.end());
      const bool resizable = seed % 4 == 0;
      PagerSetup setup{.caps = {cap},
                       .max_caps = resizable ? std::vector<int>{E} : std::vector<int>{},
                       .policy = policy,
                       .lfru_half_life = 1 + int(seed % 4) * 3,
                       .hot = {hot}};
      auto pager = ExpertPager::create(st, setup);
      ASSERT_TRUE(pager.ok()) << pager.status().to_string();
      ExpertPager& p = **pager;
      const int M = p.max_capacity(0);
      Twin tw;
      tw.state.assign(std::size_t(SlotStateLayout::state_ints(E, M)), 0);
      tw.log.assign(std::size_t(SlotStateLayout::log_ints(E)), 0);
      tw.table.assign(std::size_t(3 * E), nullptr);
      auto refill = [&] {
        ASSERT_TRUE(fill_slot_state(p, st, 0, M, tw.state.data(), tw.table.data(),
                                    reinterpret_cast<unsigned char*>(p.slot_base(0)))
                        .ok());
        ++refills;
      };
      refill();
      ASSERT_EQ(diff(tw, p, st, E, M), "") << "E " << E << " seed " << seed << " after create";
      std::vector<std::int32_t> recent;
      std::vector<ExpertRef> refs;
      std::vector<int> copy_index;
      for (int call = 0; call < 150; ++call) {
        const int limit = p.group_limit(0);
        const int T = 1 + int(rng.next() % std::uint64_t(std::max(1, limit / K)));
        const std::vector<std::int32_t> ids = random_routing(rng, E, K, T, recent);
        const std::vector<std::int32_t> d = distinct_of(ids);
        const bool host_only = rng.next() % 10 == 0;  // a host-path step: the twin refills after
        const PagerCounters before = p.counters();
        refs.resize(d.size());
        copy_index.resize(d.size());
        ASSERT_TRUE(p.acquire(0, d, refs, copy_index).ok());
        p.release(0);
        if (host_only) {
          refill();
        } else {
          SlotResolveArgs a{.ids = ids.data(),
                            .n = std::int64_t(ids.size()),
                            .E = E,
                            .max_cap = M,
                            .state = tw.state.data(),
                            .table = tw.table.data(),
                            .log = tw.log.data(),
                            .lfru_decay = p.ranker().decay_table().data(),
                            .slot_base = reinterpret_cast<unsigned char*>(p.slot_base(0))};
          set_block_layout(a, st);
          resolve_slots_twin(a);
          const SlotLogView log{tw.log.data(), E};
          const PagerCounters& after = p.counters();
          ASSERT_EQ(log.errors(), 0);
          ASSERT_EQ(log.n(), std::int32_t(ids.size()));
          ASSERT_TRUE(std::equal(ids.begin(), ids.end(), log.ids()));
          ASSERT_EQ(std::uint64_t(log.hits()), after.hits - before.hits);
          ASSERT_EQ(std::uint64_t(log.misses()), after.misses - before.misses);
          ASSERT_EQ(std::uint64_t(log.evictions()), after.evictions - before.evictions);
          for (std::size_t i = 0; i < d.size(); ++i) {  // misses in the pager's copy order
            if (copy_index[i] < 0) continue;
            ASSERT_EQ(log.miss_expert()[copy_index[i]], d[i]);
            ASSERT_EQ(refs[i].gate, p.slot_base(0) + std::size_t(log.miss_slot()[copy_index[i]]) *
                                                         st.expert_bytes());
          }
          const std::string why = diff(tw, p, st, E, M);
          ASSERT_EQ(why, "") << "E " << E << " K " << K << " cap " << cap << " hot " << hot.size()
                             << " seed " << seed << " call " << call;
          misses += log.misses();
          evictions += log.evictions();
          ++calls;
        }
        if (resizable && call % 37 == 36) {  // MV-WSA between steps: the engine refills after
          const int next =
              std::max<int>(int(hot.size()) + K, int(rng.next() % std::uint64_t(E)) + 1);
          ASSERT_TRUE(p.resize(std::vector<int>{next}).ok());
          refill();
        }
      }
    }
  }
  EXPECT_GT(calls, 3000);
  EXPECT_GT(evictions, 1000);  // the comparisons covered victim choice, not only free slots
  EXPECT_GT(misses, evictions);
  EXPECT_GT(refills, 100);
}

INSTANTIATE_TEST_SUITE_P(Policies, SlotResolveTwin,
                         ::testing::Values(EvictionPolicy::kLru, EvictionPolicy::kLfu,
                                           EvictionPolicy::kLfru),
                         [](const auto& pi) { return std::string(to_string(pi.param)); });

TEST(SlotResolveTwin, MissCopyMovesExactlyTheLoggedBlocks) {
  const int E = 6;
  const std::int64_t eb = 48;
  std::vector<unsigned char> src(std::size_t(E * eb)), slots(std::size_t(4 * eb), 0xEE);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 13 + 1);
  std::vector<std::int32_t> log(std::size_t(SlotStateLayout::log_ints(E)), 0);
  SlotLogView v{log.data(), E};
  log[1] = 2;  // misses: expert 4 -> slot 1, expert 0 -> slot 3
  const_cast<std::int32_t*>(v.miss_expert())[0] = 4;
  const_cast<std::int32_t*>(v.miss_slot())[0] = 1;
  const_cast<std::int32_t*>(v.miss_expert())[1] = 0;
  const_cast<std::int32_t*>(v.miss_slot())[1] = 3;
  copy_misses_twin({.slot_base = slots.data(),
                    .src_base = src.data(),
                    .expert_bytes = eb,
                    .log = log.data(),
                    .E = E});
  for (std::int64_t i = 0; i < eb; ++i) {
    EXPECT_EQ(slots[std::size_t(i)], 0xEE);  // slot 0 untouched
    EXPECT_EQ(slots[std::size_t(eb + i)], src[std::size_t(4 * eb + i)]);
    EXPECT_EQ(slots[std::size_t(2 * eb + i)], 0xEE);  // slot 2 untouched
    EXPECT_EQ(slots[std::size_t(3 * eb + i)], src[std::size_t(i)]);
  }
}

// The three rules part on one sequence (cap 3, half-life 3): calls {0} {1} {1,2} {1,2} {0}, then
// expert 3 misses. Stamps 5, 4, 4 (LRU evicts 1, the lower slot of the tie), uses 2, 3, 2 (LFU
// evicts 2, the older of the two), LFRU scores now 1.109, 1.527, 1.130 (LFRU evicts 0: used twice
// but four ticks apart, so its first use has decayed more than expert 2's).
TEST(SlotResolveTwinRule, LruLfuAndLfruEvictThreeDifferentExperts) {
  const int E = 8, M = 3, h = 3;
  const std::vector<double> decay = lfru_decay_table(h);
  for (const auto& [rule, want] :
       {std::pair{kernels::cuda::kSlotRuleLru, 1}, std::pair{kernels::cuda::kSlotRuleLfu, 2},
        std::pair{kernels::cuda::kSlotRuleLfru, 0}}) {
    std::vector<std::int32_t> state(std::size_t(SlotStateLayout::state_ints(E, M)), 0),
        log(std::size_t(SlotStateLayout::log_ints(E)), 0);
    std::vector<const void*> table(std::size_t(3 * E), nullptr);
    const SlotStateView st{state.data(), E, M};
    st.cap() = M;
    st.rule() = rule;
    st.half_life() = h;
    for (int e = 0; e < E; ++e) st.slot_of()[e] = -1;
    for (int s = 0; s < M; ++s) st.expert_in()[s] = -1;
    std::vector<unsigned char> slots(std::size_t(M) * 96);
    auto call = [&](const std::vector<std::int32_t>& ids) {
      SlotResolveArgs a = testing::test_resolve_args(ids, E, M, state.data(), table.data(),
                                                     log.data(), slots.data());
      a.lfru_decay = decay.data();
      resolve_slots_twin(a);
    };
    for (const auto& ids : std::vector<std::vector<std::int32_t>>{{0}, {1}, {1, 2}, {1, 2}, {0}}) {
      call(ids);
    }
    call({3});
    const SlotLogView v{log.data(), E};
    ASSERT_EQ(v.misses(), 1);
    EXPECT_EQ(v.evicted()[0], want) << "rule " << rule;
    EXPECT_EQ(st.slot_of()[3], want) << "rule " << rule;  // expert e was loaded into slot e
    EXPECT_EQ(st.uses()[std::size_t(want)], 1u);
    EXPECT_EQ(st.score()[std::size_t(want)], 1.0);
    EXPECT_EQ(st.score_at()[std::size_t(want)], 6u);
  }
  // The host pager with the same calls and LFRU makes the same choice.
  auto m = model_with(E, 2);
  ASSERT_TRUE(m);
  auto store = ExpertStore::create(m->geometry, m->params);
  ASSERT_TRUE(store.ok());
  auto pager = ExpertPager::create(
      **store, {.caps = {M}, .policy = EvictionPolicy::kLfru, .lfru_half_life = h});
  ASSERT_TRUE(pager.ok()) << pager.status().to_string();
  ExpertPager& p = **pager;
  for (const auto& ids :
       std::vector<std::vector<std::int32_t>>{{0}, {1}, {1, 2}, {1, 2}, {0}, {3}}) {
    std::vector<ExpertRef> refs(ids.size());
    std::vector<int> copy_index(ids.size());
    ASSERT_TRUE(p.acquire(0, ids, refs, copy_index).ok());
    p.release(0);
  }
  EXPECT_EQ(p.expert_in(0, 0), 3);
  EXPECT_FALSE(p.is_resident(0, 0));
}

struct EngineRun {
  testing::RunRecord rec;
  PagerCounters pager;
  std::uint64_t device_resolved = 0;
  std::vector<std::vector<int>> slots;  // [L][max cap] the pager's expert per slot at the end
};

Result<EngineRun> run_paged(const model::DecoderGeometry& geo, const model::ModelParams& params,
                            ExpertMode mode, int cap, bool hot, bool device_resolve,
                            int max_batch_tokens, EvictionPolicy policy = EvictionPolicy::kLru) {
  EngineConfig cfg;
  cfg.pager.mode = mode;
  cfg.pager.policy = policy;
  cfg.pager.slots_per_layer = cap;
  cfg.pager.device_resolve = device_resolve;
  if (hot) {
    cfg.pager.hot_experts.assign(std::size_t(geo.layers), {});
    for (int l = 0; l < geo.layers; ++l) {
      if (geo.layer_is_moe[l]) cfg.pager.hot_experts[std::size_t(l)] = {l % geo.experts};
    }
  }
  cfg.max_batch_tokens = max_batch_tokens;
  cfg.max_running = 3;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  FERRY_ASSIGN_OR_RETURN(auto eng, Engine::create(geo, params, cfg));
  EngineRun r;
  FERRY_ASSIGN_OR_RETURN(r.rec, testing::run_engine(*eng, testing::mixed_requests(geo.vocab)));
  if (const ExpertPager* p = eng->experts().pager()) {
    r.pager = p->counters();
    for (int l = 0; l < geo.layers; ++l) {
      r.slots.emplace_back();
      for (int s = 0; s < p->max_capacity(l); ++s) r.slots.back().push_back(p->expert_in(l, s));
    }
  }
  r.device_resolved = eng->experts().counters().device_resolved;
  return r;
}

class SlotResolveEngine : public ::testing::TestWithParam<const char*> {};

// The CPU engine through the twin gives the host path's bits, pager counters and final slots,
// and resident's bits; the twin really ran (decode steps) and the caps really missed.
TEST_P(SlotResolveEngine, TwinGivesTheHostPathsBitsAndCounters) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const int K = m.geometry.top_k, E = m.geometry.experts;
  auto ref = run_paged(m.geometry, m.params, ExpertMode::kResident, 0, false, false, 8);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (const int cap : {K, K + 1, std::max(K, E / 2), E}) {
    for (const EvictionPolicy policy :
         {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kLfru})
      for (const bool hot : {false, true}) {
        if (hot && cap - 1 < K) continue;  // hot experts count against the cap
        const std::string what =
            fmt::format("{} cap {} {}{}", GetParam(), cap, to_string(policy), hot ? " hot" : "");
        auto host = run_paged(m.geometry, m.params, ExpertMode::kPaged, cap, hot, false, 8, policy);
        auto twin = run_paged(m.geometry, m.params, ExpertMode::kPaged, cap, hot, true, 8, policy);
        ASSERT_TRUE(host.ok() && twin.ok()) << what;
        EXPECT_EQ(host->device_resolved, 0u) << what;
        EXPECT_GT(twin->device_resolved, 0u) << what;
        EXPECT_TRUE(twin->rec == host->rec) << what;
        EXPECT_TRUE(twin->rec == ref->rec) << what << " (vs resident)";
        EXPECT_EQ(twin->pager.hits, host->pager.hits) << what;
        EXPECT_EQ(twin->pager.misses, host->pager.misses) << what;
        EXPECT_EQ(twin->pager.evictions, host->pager.evictions) << what;
        EXPECT_EQ(twin->pager.bytes_copied, host->pager.bytes_copied) << what;
        EXPECT_EQ(twin->pager.copy_batches, host->pager.copy_batches) << what;
        EXPECT_EQ(twin->pager.acquires, host->pager.acquires) << what;
        EXPECT_EQ(twin->slots, host->slots) << what;
        if (cap < E) {
          EXPECT_GT(host->pager.evictions, 0u) << what;
        }
      }
  }
}

INSTANTIATE_TEST_SUITE_P(MoeFixtures, SlotResolveEngine,
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe"),
                         [](const auto& pi) { return std::string(pi.param); });

TEST(SlotResolveEngineConfig, EveryPolicyWithoutMissPlacementResolvesOnTheDevicePath) {
  auto m = testing::tiny_builtin_moe(5);
  ASSERT_TRUE(m);
  for (const auto policy : {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kLfru}) {
    EngineConfig cfg;
    cfg.pager.mode = ExpertMode::kPaged;
    cfg.pager.policy = policy;
    cfg.pager.slots_per_layer = 4;
    cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
    auto eng = Engine::create(m->geometry, m->params, cfg);
    ASSERT_TRUE(eng.ok());
    EXPECT_TRUE((*eng)->experts().device_resolves()) << to_string(policy);
  }
  EngineConfig cfg;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.pager.slots_per_layer = 4;
  cfg.pager.bypass_window = 1;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  auto eng = Engine::create(m->geometry, m->params, cfg);
  ASSERT_TRUE(eng.ok());
  EXPECT_FALSE((*eng)->experts().device_resolves());
  cfg.pager.bypass_window = 0;
  auto lru = Engine::create(m->geometry, m->params, cfg);
  ASSERT_TRUE(lru.ok());
  EXPECT_TRUE((*lru)->experts().device_resolves());
}

// Two identical one-token requests run in lockstep: every step routes 2K rows per layer to the
// same K experts. At cap K no step's rows fit the slots but its experts do, and the resolver
// places experts, not rows: the twin resolves those steps (before, fits() counted rows and none
// did), with resident's ids and logits bits and the host path's pager counters.
TEST(SlotResolveEngineConfig, RowsAboveTheCapResolveWhenTheirDistinctExpertsFit) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const model::DecoderGeometry& geo = f.model->geometry;
  std::vector<GenerationRequest> reqs(2);
  for (GenerationRequest& r : reqs) {
    r.prompt = {7 % geo.vocab};
    r.max_new_tokens = 5;
  }
  auto run = [&](ExpertMode mode, bool device_resolve) -> Result<EngineRun> {
    EngineConfig cfg;
    cfg.pager.mode = mode;
    cfg.pager.slots_per_layer = mode == ExpertMode::kPaged ? geo.top_k : 0;
    cfg.pager.device_resolve = device_resolve;
    cfg.max_batch_tokens = 8;
    cfg.max_running = 2;
    cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
    FERRY_ASSIGN_OR_RETURN(auto eng, Engine::create(geo, f.model->params, cfg));
    EngineRun r;
    FERRY_ASSIGN_OR_RETURN(r.rec, testing::run_engine(*eng, reqs));
    if (const ExpertPager* p = eng->experts().pager()) r.pager = p->counters();
    r.device_resolved = eng->experts().counters().device_resolved;
    return r;
  };
  auto ref = run(ExpertMode::kResident, false);
  auto host = run(ExpertMode::kPaged, false);
  auto twin = run(ExpertMode::kPaged, true);
  ASSERT_TRUE(ref.ok() && host.ok() && twin.ok());
  int moe = 0;
  for (bool b : geo.layer_is_moe) moe += b;
  // Every step (the two prompts' prefill and 4 decode steps) in every MoE layer.
  EXPECT_EQ(twin->device_resolved, std::uint64_t(5 * moe));
  EXPECT_EQ(host->device_resolved, 0u);
  EXPECT_TRUE(twin->rec == ref->rec);
  EXPECT_TRUE(twin->rec == host->rec);
  EXPECT_EQ(twin->pager.misses, host->pager.misses);
  EXPECT_EQ(twin->pager.evictions, host->pager.evictions);
  EXPECT_EQ(twin->pager.acquires, host->pager.acquires);
}

// routed_experts_bound: a forcing hook's rows bound a layer's distinct experts (the CUDA runner's
// begin_device_step input): repeated experts count once, a router-chosen row (-1) K times, and
// the scratch is left zeroed.
TEST(SlotResolveEngineConfig, ForcedRowsBoundTheDistinctExperts) {
  std::vector<unsigned char> seen(8, 0);
  const std::vector<std::int32_t> forced = {1, 2, 2, 1, -1, -1, 5, 1};  // T 4, K 2
  EXPECT_EQ(routed_experts_bound(forced.data(), 4, 2, seen), 3 + 2);
  EXPECT_EQ(routed_experts_bound(forced.data(), 2, 2, seen), 2);
  EXPECT_EQ(seen, std::vector<unsigned char>(8, 0));
}

// The replay's check can fail: a pager changed behind the executor's back (resized directly, so
// the resolver is not told its state is stale) diverges from the twin's state, and the engine's
// step says so with internal_error instead of computing from slots the pager no longer holds.
// Through the executor (Engine::resize_pools) the same resize is followed by a refill and the run
// completes on the device path (bits across resizes: the MoE fixtures above and wsa_live_test).
TEST(SlotResolveEngineConfig, ADivergedPagerIsAnInternalErrorNotSilentlyWrongBits) {
  auto m = testing::tiny_builtin_moe(11);
  ASSERT_TRUE(m);
  const auto& geo = m->geometry;
  EngineConfig cfg;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.pager.slots_per_layer = 6;
  cfg.pager.resizable = true;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  GenerationRequest r;
  for (int i = 0; i < 5; ++i) r.prompt.push_back((i * 17 + 3) % geo.vocab);
  r.max_new_tokens = 40;
  const std::vector<int> small(std::size_t(geo.layers), 3);
  for (const bool behind_its_back : {false, true}) {
    auto eng = Engine::create(geo, m->params, cfg);
    ASSERT_TRUE(eng.ok());
    ASSERT_TRUE((*eng)->submit(r).ok());
    for (int i = 0; i < 4; ++i) ASSERT_TRUE((*eng)->step().ok());
    if (behind_its_back) {
      ASSERT_TRUE((*eng)->experts().pager()->resize(small).ok());
    } else {
      ASSERT_TRUE((*eng)->resize_pools(small, 0).ok());
    }
    Status failed = ok_status();
    while (!(*eng)->idle() && failed.ok()) {
      auto st = (*eng)->step();
      if (!st.ok()) failed = st.status();
    }
    if (behind_its_back) {
      EXPECT_EQ(failed.code(), StatusCode::kInternal) << failed.to_string();
      EXPECT_NE(failed.to_string().find("diverged"), std::string::npos) << failed.to_string();
    } else {
      EXPECT_TRUE(failed.ok()) << failed.to_string();
      EXPECT_GT((*eng)->experts().counters().device_resolved, 0u);
    }
  }
}

}  // namespace
}  // namespace ferry::serve
