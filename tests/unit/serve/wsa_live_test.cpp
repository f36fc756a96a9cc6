// SPDX-License-Identifier: Apache-2.0
// MV-WSA while serving (serve/wsa/live_split.h) on the built-in MoE:
//   - an engine under LiveSplit (automatic decisions every few steps, plus forced resizes up and
//     down: all experts, top-k only, uneven caps, a KV pool shrunk so used blocks must move)
//     produces the same tokens and bit-identical logits as a fixed-split engine, finishes every
//     request by length, and never holds more than the budget or less than the KV floor;
//   - with on-demand KV and preemption, a pool too small for every request at once preempts and
//     recomputes, yet the tokens equal an unconstrained run (logits within the f32 GEMM noise of a
//     different batch, as in engine_test's batching check), and no request is lost;
//   - pager and KV resize units: budget accounting, eviction of only resident experts, block
//     moves keep the K/V rows.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "serve/builtin_model.h"
#include "serve/wsa/agentic_workload.h"
#include "serve/wsa/live_split.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

std::unique_ptr<BuiltinModel> builtin() { return testing::tiny_builtin_moe(23); }

std::vector<GenerationRequest> requests() {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<std::int32_t> p;
    for (int j = 0; j < 6 + 5 * i; ++j) p.push_back((j * 37 + i * 11 + 5) % 256);
    reqs.push_back({.prompt = p, .max_new_tokens = 10 + i});
  }
  reqs[2].sampling = {.temperature = 0.8f, .top_k = 20, .seed = 99};
  return reqs;
}

constexpr int kBlockTokens = 4;

EngineConfig base_config() {
  EngineConfig cfg;
  cfg.kv.block_tokens = kBlockTokens;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.max_batch_tokens = 24;
  cfg.max_running = 3;
  return cfg;
}

struct Run {
  testing::RunRecord rec;
  std::vector<FinishReason> finish;
};

// Steps until idle, calling `at_step(step)` before each step; records tokens, logits, finishes.
Result<Run> run(Engine& eng, const std::vector<GenerationRequest>& reqs,
                const std::function<void(int)>& at_step = {}) {
  Run r;
  eng.set_logits_observer([&r](RequestId id, int, std::span<const float> row) {
    r.rec.logits[id].emplace_back(row.begin(), row.end());
  });
  FERRY_ASSIGN_OR_RETURN(const std::vector<RequestId> ids,
                         testing::submit_and_step(eng, reqs, at_step));
  for (RequestId id : ids) {
    FERRY_ASSIGN_OR_RETURN(RequestOutput out, eng.take_output(id));
    r.rec.tokens[id] = out.tokens;
    r.finish.push_back(out.finish);
  }
  eng.set_logits_observer(nullptr);
  return r;
}

TEST(WsaLive, ResizingWhileServingKeepsOutputsBitIdentical) {
  auto m = builtin();
  ASSERT_TRUE(m);
  const auto reqs = requests();
  // The fixed split: 4 of 8 experts per layer, KV for every request at once.
  EngineConfig fixed_cfg = base_config();
  fixed_cfg.pager.slots_per_layer = 4;
  auto fixed = Engine::create(m->geometry, m->params, fixed_cfg);
  ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();
  const std::size_t eb = (*fixed)->experts().store()->expert_bytes();
  fixed_cfg.kv = {.block_tokens = kBlockTokens, .budget_bytes = 0};
  // Sized after the block size is known: 40 blocks hold all six requests' whole reservations.
  auto probe =
      KvCache::create(m->geometry, {.block_tokens = kBlockTokens, .budget_bytes = 1 << 20});
  ASSERT_TRUE(probe.ok());
  const std::size_t kb = (*probe)->block_bytes();
  fixed_cfg.kv.budget_bytes = 40 * kb;
  fixed = Engine::create(m->geometry, m->params, fixed_cfg);
  ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();
  auto want = run(**fixed, reqs);
  ASSERT_TRUE(want.ok()) << want.status().to_string();

  // The live engine: one budget of 2 x 8 slots + 40 blocks, starting from 3 slots per layer.
  const std::size_t budget = 2 * 8 * eb + 40 * kb;
  EngineConfig live_cfg = base_config();
  live_cfg.pager.slots_per_layer = 3;
  live_cfg.pager.resizable = true;
  live_cfg.kv = {.block_tokens = kBlockTokens,
                 .budget_bytes = budget - 2 * 3 * eb,
                 .max_budget_bytes = budget};
  live_cfg.device_budget_bytes = budget;
  auto live = Engine::create(m->geometry, m->params, live_cfg);
  ASSERT_TRUE(live.ok()) << live.status().to_string();
  // Floor 3 x 11 blocks: at least the three largest requests' reservations (31 blocks), so
  // admission never waits on the KV pool and the schedule -- hence every batch -- is the fixed
  // run's; what changes is only where experts and blocks live.
  auto ls = wsa::LiveSplit::attach(**live, {.budget_bytes = budget,
                                            .concurrency = 3,
                                            .max_context_tokens = 44,
                                            .decide_every_steps = 3,
                                            .link_bytes_per_s = 1e9});
  ASSERT_TRUE(ls.ok()) << ls.status().to_string();
  Engine& eng = **live;
  auto got = run(eng, reqs, [&](int step) {
    switch (step) {
      case 2:  // all experts resident, the KV pool at the rest of the budget
        (*ls)->force({.slots = {8, 8}, .kv_blocks = 40});
        break;
      case 5:  // top-k only
        (*ls)->force({.slots = {2, 2}, .kv_blocks = 40});
        break;
      case 8:  // uneven caps
        (*ls)->force({.slots = {7, 2}, .kv_blocks = 40});
        break;
      case 11:  // KV down to the floor
        (*ls)->force({.slots = {2, 6}, .kv_blocks = 33});
        break;
      default:
        break;
    }
  });
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->rec.tokens, want->rec.tokens);
  ASSERT_EQ(got->rec.logits.size(), want->rec.logits.size());
  for (const auto& [id, rows] : want->rec.logits) {
    ASSERT_EQ(got->rec.logits.at(id).size(), rows.size()) << id;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      EXPECT_TRUE(testing::same_bits(got->rec.logits.at(id)[r], rows[r])) << id << " " << r;
    }
  }
  for (FinishReason f : got->finish) EXPECT_EQ(f, FinishReason::kLength);
  const auto& st = (*ls)->stats();
  EXPECT_EQ(st.forced, 4u);
  EXPECT_EQ(st.refused, 0u);
  EXPECT_EQ((*ls)->kv_floor_blocks(), 33);
  EXPECT_GT(st.decisions, 0u);
  EXPECT_LE(st.max_bytes, budget);
  EXPECT_GE(st.min_kv_blocks, (*ls)->kv_floor_blocks());
  EXPECT_LE(eng.device_budget().bytes_peak(), budget);
  const PagerCounters& pc = eng.experts().pager()->counters();
  EXPECT_GE(pc.resizes, 4u);
  EXPECT_GT(pc.resize_evictions, 0u) << "no shrink evicted anything: the test lost its teeth";
}

TEST(WsaLive, PreemptionRecomputesAndKeepsTokens) {
  auto m = builtin();
  ASSERT_TRUE(m);
  const auto reqs = requests();
  EngineConfig roomy = base_config();
  roomy.pager.slots_per_layer = 4;
  roomy.kv = {.block_tokens = kBlockTokens, .budget_bytes = 8 << 20};
  auto a = Engine::create(m->geometry, m->params, roomy);
  ASSERT_TRUE(a.ok());
  auto want = run(**a, reqs);
  ASSERT_TRUE(want.ok()) << want.status().to_string();

  EngineConfig tight = roomy;
  tight.kv_preempt = true;
  auto probe =
      KvCache::create(m->geometry, {.block_tokens = kBlockTokens, .budget_bytes = 1 << 20});
  ASSERT_TRUE(probe.ok());
  // The largest request needs 12 blocks; 14 cannot hold three growing requests at once.
  tight.kv.budget_bytes = 14 * (*probe)->block_bytes();
  auto b = Engine::create(m->geometry, m->params, tight);
  ASSERT_TRUE(b.ok());
  auto got = run(**b, reqs);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_GT((*b)->stats().preemptions, 0u);
  EXPECT_GT((*b)->stats().recompute_tokens, 0u);
  EXPECT_EQ(got->rec.tokens, want->rec.tokens);
  for (FinishReason f : got->finish) EXPECT_EQ(f, FinishReason::kLength);
  for (const auto& [id, rows] : want->rec.logits) {
    ASSERT_EQ(got->rec.logits.at(id).size(), rows.size());
    for (std::size_t r = 0; r < rows.size(); ++r) {
      for (std::size_t v = 0; v < rows[r].size(); ++v) {
        ASSERT_NEAR(got->rec.logits.at(id)[r][v], rows[r][v], 1e-4 * (1 + std::fabs(rows[r][v])));
      }
    }
  }
}

TEST(WsaLive, KvResizeMovesUsedBlocksWithTheirRows) {
  auto m = builtin();
  ASSERT_TRUE(m);
  auto probe =
      KvCache::create(m->geometry, {.block_tokens = kBlockTokens, .budget_bytes = 1 << 20});
  ASSERT_TRUE(probe.ok());
  const std::size_t kb = (*probe)->block_bytes();
  mem::MemoryBudget shared(cpu_engine_pool_tier(), 10 * kb);
  auto kv = KvCache::create(
      m->geometry,
      {.block_tokens = kBlockTokens, .budget_bytes = 8 * kb, .max_budget_bytes = 16 * kb}, &shared);
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  KvCache& c = **kv;
  EXPECT_EQ(c.num_blocks(), 8);
  EXPECT_EQ(c.capacity_blocks(), 16);
  EXPECT_EQ(shared.bytes_used(), 8 * kb);
  BlockTable a, b;
  ASSERT_TRUE(c.reserve(a, 5 * kBlockTokens).ok());
  ASSERT_TRUE(c.reserve(b, 3 * kBlockTokens).ok());
  c.release(a);  // b holds blocks 5..7: the top of the pool
  const int row = 2 * 16;
  for (int l = 0; l < 2; ++l) {
    for (int p = 0; p < 3 * kBlockTokens; ++p) {
      for (int i = 0; i < row; ++i) c.k_row(l, b, p)[i] = float(l * 1000 + p * 10 + i);
    }
  }
  std::vector<BlockTable*> tables = {&b};
  EXPECT_FALSE(c.resize(2, tables).ok());   // below the 3 in use
  EXPECT_FALSE(c.resize(11, tables).ok());  // the shared budget holds 10
  EXPECT_EQ(c.num_blocks(), 8);
  ASSERT_TRUE(c.resize(3, tables).ok());
  EXPECT_EQ(shared.bytes_used(), 3 * kb);
  EXPECT_EQ(c.blocks_moved(), 3u);
  for (std::int32_t blk : b.blocks) EXPECT_LT(blk, 3);
  for (int l = 0; l < 2; ++l) {
    for (int p = 0; p < 3 * kBlockTokens; ++p) {
      for (int i = 0; i < row; ++i) {
        ASSERT_EQ(c.k_row(l, b, p)[i], float(l * 1000 + p * 10 + i)) << l << " " << p;
      }
    }
  }
  EXPECT_EQ(c.free_blocks(), 0);
  ASSERT_TRUE(c.resize(10, tables).ok());
  EXPECT_EQ(c.free_blocks(), 7);
  EXPECT_EQ(shared.bytes_used(), 10 * kb);
}

TEST(WsaLive, PagerResizeEvictsOnlyResidentExpertsAndKeepsBudget) {
  auto m = builtin();
  ASSERT_TRUE(m);
  auto store = ExpertStore::create(m->geometry, m->params);
  ASSERT_TRUE(store.ok());
  const std::size_t eb = (*store)->expert_bytes();
  mem::MemoryBudget shared(cpu_engine_pool_tier(), 12 * eb);
  auto p = ExpertPager::create(
      **store, {.caps = {4, 4}, .max_caps = {8, 8}, .hot = {{6}, {}}, .shared = &shared});
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ExpertPager& pg = **p;
  EXPECT_EQ(shared.bytes_used(), 8 * eb);
  std::vector<ExpertRef> refs(3);
  for (std::vector<std::int32_t> ids :
       {std::vector<std::int32_t>{0, 1, 2}, std::vector<std::int32_t>{3, 1, 2}}) {
    ASSERT_TRUE(pg.acquire(0, ids, refs).ok());
    pg.release(0);
  }
  // Layer 0 holds hot 6 and 3, 1, 2 (0 was evicted). Shrink to 2: only 6 and the most recent
  // survive, in slots below 2, with their bytes intact.
  const std::array<int, 2> small = {2, 4};
  ASSERT_TRUE(pg.resize(small).ok());
  EXPECT_EQ(pg.capacity(0), 2);
  EXPECT_EQ(shared.bytes_used(), 6 * eb);
  int hot_found = 0;
  for (int s = 0; s < 2; ++s) {
    const int e = pg.expert_in(0, s);
    ASSERT_GE(e, 0);
    hot_found += e == 6;
    // A survivor is a hit and its slot holds its bytes (moved ones were copied whole).
    const std::uint64_t misses = pg.counters().misses;
    std::vector<ExpertRef> one(1);
    ASSERT_TRUE(pg.acquire(0, std::vector<std::int32_t>{e}, one).ok());
    pg.release(0);
    EXPECT_EQ(pg.counters().misses, misses);
    EXPECT_EQ(std::memcmp(one[0].gate, (*store)->block(0, e), eb), 0) << "expert " << e;
  }
  EXPECT_EQ(hot_found, 1);
  const std::array<int, 2> hot_only = {1, 4};  // cap must exceed the hot count
  EXPECT_FALSE(pg.resize(hot_only).ok());
  const std::array<int, 2> big = {8, 5};  // 13 slots > the shared 12
  EXPECT_FALSE(pg.resize(big).ok());
  EXPECT_EQ(pg.capacity(0), 2);
  const std::array<int, 2> fits = {8, 4};
  ASSERT_TRUE(pg.resize(fits).ok());
  EXPECT_EQ(shared.bytes_used(), 12 * eb);
  std::vector<ExpertRef> r5(5);
  ASSERT_TRUE(pg.acquire(0, std::vector<std::int32_t>{0, 1, 2, 3, 4}, r5).ok());
  pg.release(0);
}

// Multi-turn agentic sessions (each turn re-sends the session's context plus a user message)
// through an engine under --split auto's configuration: on-demand KV with preemption, a budget
// whose KV share starts below what the sessions want, automatic decisions. Every turn finishes by
// length with the tokens of a roomy fixed engine.
std::map<std::pair<int, int>, std::vector<std::int32_t>> run_agentic(Engine& eng,
                                                                     const wsa::AgenticWorkload& w,
                                                                     int vocab) {
  std::map<std::pair<int, int>, std::vector<std::int32_t>> out;
  std::map<RequestId, std::pair<int, int>> turn_of;
  auto submit = [&](int s, int t) {
    auto id = eng.submit({.prompt = w.turn_prompt(s, t, vocab),
                          .max_new_tokens = w.turns(s)[std::size_t(t)].output});
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    if (id.ok()) turn_of[*id] = {s, t};
  };
  for (int s = 0; s < w.sessions(); ++s) submit(s, 0);
  while (!eng.idle()) {
    auto ev = eng.step();
    EXPECT_TRUE(ev.ok()) << ev.status().to_string();
    if (!ev.ok()) break;
    for (const TokenEvent& e : *ev) {
      if (e.finish == FinishReason::kNone) continue;
      EXPECT_EQ(e.finish, FinishReason::kLength);
      auto o = eng.take_output(e.id);
      EXPECT_TRUE(o.ok());
      const auto [s, t] = turn_of.at(e.id);
      out[{s, t}] = o->tokens;
      if (t + 1 < static_cast<int>(w.turns(s).size())) submit(s, t + 1);
    }
  }
  return out;
}

// The reference the auto-split runs must equal: a fixed engine with every expert resident and
// a roomy KV pool.
std::map<std::pair<int, int>, std::vector<std::int32_t>> fixed_engine_tokens(
    const BuiltinModel& m, const wsa::AgenticWorkload& w) {
  EngineConfig roomy = base_config();
  roomy.pager.slots_per_layer = 8;
  roomy.kv = {.block_tokens = kBlockTokens, .budget_bytes = 8 << 20};
  auto a = Engine::create(m.geometry, m.params, roomy);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  return a.ok() ? run_agentic(**a, w, m.geometry.vocab)
                : std::map<std::pair<int, int>, std::vector<std::int32_t>>{};
}

// The KV floor (one request of the workload's longest context) and a budget of 5 expert slots
// per MoE layer plus the floor and 4 blocks: tight enough that the live split has to choose.
// {0, 0} if the block size cannot be probed.
std::pair<int, std::size_t> tight_split(const BuiltinModel& m, const wsa::AgenticWorkload& w) {
  auto probe = KvCache::create(m.geometry, {.block_tokens = kBlockTokens, .budget_bytes = 1 << 20});
  if (!probe.ok()) return {0, 0};
  const std::size_t kb = (*probe)->block_bytes();
  const std::size_t eb = 3 * 64 * 32 * sizeof(float);
  const int floor = (w.max_context() + kBlockTokens - 1) / kBlockTokens;
  return {floor, 2 * 5 * eb + std::size_t(floor + 4) * kb};
}

// Four sessions of three turns over the built-in model's 2 MoE layers x 8 experts.
wsa::AgenticSpec tiny_agentic_spec() {
  return {.sessions = 4,
          .turns = 3,
          .prefix_tokens = 24,
          .user_min = 3,
          .user_max = 8,
          .output_min = 4,
          .output_max = 9,
          .moe_layers = 2,
          .experts = 8,
          .top_k = 2,
          .seed = 5};
}

TEST(WsaLive, AgenticSessionsUnderAutoSplitMatchAFixedEngine) {
  auto m = builtin();
  ASSERT_TRUE(m);
  const wsa::AgenticWorkload w(tiny_agentic_spec());
  const auto want = fixed_engine_tokens(*m, w);
  ASSERT_FALSE(want.empty());

  EngineConfig cfg = base_config();
  const auto [floor, budget] = tight_split(*m, w);
  ASSERT_GT(budget, 0u);
  ASSERT_TRUE(wsa::configure_auto_split(m->geometry, budget, floor, cfg).ok());
  auto b = Engine::create(m->geometry, m->params, cfg);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto ls = wsa::LiveSplit::attach(**b, {.budget_bytes = budget,
                                         .concurrency = 1,
                                         .max_context_tokens = w.max_context(),
                                         .decide_every_steps = 2,
                                         .link_bytes_per_s = 1e9});
  ASSERT_TRUE(ls.ok()) << ls.status().to_string();
  const auto got = run_agentic(**b, w, m->geometry.vocab);
  EXPECT_EQ(got.size(), std::size_t(4 * 3));
  EXPECT_EQ(got, want);
  EXPECT_GT((*ls)->stats().decisions, 0u);
  EXPECT_LE((*b)->device_budget().bytes_peak(), budget);
  EXPECT_GE((*ls)->stats().min_kv_blocks < 0 ? floor : (*ls)->stats().min_kv_blocks, floor);
  std::printf("agentic auto split: preemptions=%llu moves=%llu refused=%llu kv_blocks=%d\n",
              static_cast<unsigned long long>((*b)->stats().preemptions),
              static_cast<unsigned long long>((*ls)->stats().moves),
              static_cast<unsigned long long>((*ls)->stats().refused), (*b)->kv().num_blocks());
}

TEST(WsaLive, DecodeFloorKeepsEveryCapAboveWhatADecodeStepRoutes) {
  // decode_on_device: every cap stays >= max_running x top-k + hot, so a decode step of
  // max_running sequences fits the device resolver. Here 3 x 2 = 6 of 8 experts; the 50/50
  // start is below it (2-3 slots per layer), so the first decision must lift it, and no later
  // decision may go below it. The plain floor (top-k + hot = 2) lets decisions go lower.
  EXPECT_EQ(wsa::decode_floor_slots(128, 8, 4, 0), 32);
  EXPECT_EQ(wsa::decode_floor_slots(128, 8, 4, 3), 35);
  EXPECT_EQ(wsa::decode_floor_slots(8, 2, 5, 0), 8);  // never above E
  auto m = builtin();
  ASSERT_TRUE(m);
  const wsa::AgenticWorkload w(tiny_agentic_spec());
  const auto want = fixed_engine_tokens(*m, w);
  ASSERT_FALSE(want.empty());

  const int floor_slots =
      wsa::decode_floor_slots(m->geometry.experts, m->geometry.top_k, base_config().max_running, 0);
  ASSERT_EQ(floor_slots, 6);
  const auto [floor, tight] = tight_split(*m, w);
  ASSERT_GT(tight, 0u);
  const std::size_t eb = 3 * 64 * 32 * sizeof(float);
  const std::size_t budget = tight + 2 * std::size_t(floor_slots - 5) * eb;
  for (const bool on : {false, true}) {
    SCOPED_TRACE(on ? "decode floor on" : "decode floor off");
    EngineConfig cfg = base_config();
    ASSERT_TRUE(wsa::configure_auto_split(m->geometry, budget, floor, cfg).ok());
    auto b = Engine::create(m->geometry, m->params, cfg);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    const auto& moe = m->geometry.layer_is_moe;
    const int first_moe = static_cast<int>(std::find(moe.begin(), moe.end(), true) - moe.begin());
    const int start = (*b)->experts().pager()->capacity(first_moe);
    ASSERT_LT(start, floor_slots);
    auto ls = wsa::LiveSplit::attach(**b, {.budget_bytes = budget,
                                           .concurrency = 1,
                                           .max_context_tokens = w.max_context(),
                                           .decide_every_steps = 2,
                                           .link_bytes_per_s = 1e9,
                                           .decode_on_device = on});
    ASSERT_TRUE(ls.ok()) << ls.status().to_string();
    EXPECT_EQ((*ls)->model().min_slots, on ? floor_slots : m->geometry.top_k);
    int lowest_applied = 1 << 30;
    const auto got = run_agentic(**b, w, m->geometry.vocab);
    EXPECT_EQ(got, want);
    ASSERT_GT((*ls)->stats().moves, 0u);
    for (const wsa::DecisionRecord& d : (*ls)->stats().log) {
      if (!d.applied) continue;
      for (int c : d.target.slots) lowest_applied = std::min(lowest_applied, c);
    }
    if (on) {
      EXPECT_GE(lowest_applied, floor_slots);
      for (int c : (*ls)->current().slots) EXPECT_GE(c, floor_slots);
    } else {
      EXPECT_LT(lowest_applied, floor_slots);  // the floor is what kept them up
    }
    EXPECT_LE((*b)->device_budget().bytes_peak(), budget);
    std::printf("decode floor %s: moves=%llu lowest applied cap=%d final %s\n", on ? "on" : "off",
                static_cast<unsigned long long>((*ls)->stats().moves), lowest_applied,
                wsa::to_string((*ls)->current()).c_str());
  }
  // A budget of 5 slots per layer next to the KV floor cannot give every layer the decode floor
  // (6): the floor drops to the largest uniform cap that fits, so the controller still has
  // splits to choose from and moves (a floor no split meets would refuse every decision).
  EngineConfig cfg = base_config();
  ASSERT_TRUE(wsa::configure_auto_split(m->geometry, tight, floor, cfg).ok());
  auto b = Engine::create(m->geometry, m->params, cfg);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto ls = wsa::LiveSplit::attach(**b, {.budget_bytes = tight,
                                         .concurrency = 1,
                                         .max_context_tokens = w.max_context(),
                                         .decide_every_steps = 2,
                                         .link_bytes_per_s = 1e9,
                                         .decode_on_device = true});
  ASSERT_TRUE(ls.ok()) << ls.status().to_string();
  const wsa::CostModel& cm = (*ls)->model();
  const int fits = static_cast<int>((tight - std::size_t(floor) * cm.kv_block_bytes) / (2 * eb));
  ASSERT_LT(fits, floor_slots);
  EXPECT_EQ(cm.min_slots, std::max(m->geometry.top_k, fits));
  EXPECT_EQ(run_agentic(**b, w, m->geometry.vocab), want);
  EXPECT_GT((*ls)->stats().moves, 0u);
  EXPECT_EQ((*ls)->stats().refused, 0u) << (*ls)->stats().last_refusal;
  for (int c : (*ls)->current().slots) EXPECT_GE(c, cm.min_slots);
}

TEST(WsaLive, AWarmStartBeginsAtItsSplitAndServesTheSameTokens) {
  // configure_auto_split from a given split (ferry serve --split auto --trace FILE): the pools
  // start at its caps and blocks, and the outputs are a fixed engine's. Splits that do not fit
  // the engine are refused and leave the config as it was.
  auto m = builtin();
  ASSERT_TRUE(m);
  const wsa::AgenticWorkload w(tiny_agentic_spec());
  const auto want = fixed_engine_tokens(*m, w);
  ASSERT_FALSE(want.empty());

  const auto [floor, budget] = tight_split(*m, w);
  ASSERT_GT(budget, 0u);
  const wsa::Split start{.slots = {7, 3}, .kv_blocks = floor + 1};
  EngineConfig cfg = base_config();
  ASSERT_TRUE(wsa::configure_auto_split(m->geometry, budget, floor, start, cfg).ok());
  auto b = Engine::create(m->geometry, m->params, cfg);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  std::vector<int> caps;
  for (int l = 0; l < m->geometry.layers; ++l) {
    if (m->geometry.layer_is_moe[std::size_t(l)])
      caps.push_back((*b)->experts().pager()->capacity(l));
  }
  EXPECT_EQ(caps, start.slots);
  EXPECT_EQ((*b)->kv().num_blocks(), start.kv_blocks);
  auto ls = wsa::LiveSplit::attach(**b, {.budget_bytes = budget,
                                         .concurrency = 1,
                                         .max_context_tokens = w.max_context(),
                                         .decide_every_steps = 2,
                                         .link_bytes_per_s = 1e9});
  ASSERT_TRUE(ls.ok()) << ls.status().to_string();
  EXPECT_EQ((*ls)->current(), start);
  EXPECT_EQ(run_agentic(**b, w, m->geometry.vocab), want);
  EXPECT_LE((*b)->device_budget().bytes_peak(), budget);

  const std::size_t eb = 3 * 64 * 32 * sizeof(float);
  const std::size_t kb = (*b)->kv().block_bytes();
  const int most_blocks = static_cast<int>((budget - 2 * 5 * eb) / kb);
  for (const wsa::Split& bad :
       {wsa::Split{.slots = {5, 5, 5}, .kv_blocks = floor},  // three MoE layers, the model two
        wsa::Split{.slots = {5}, .kv_blocks = floor},
        wsa::Split{.slots = {1, 5}, .kv_blocks = floor},               // below top-k
        wsa::Split{.slots = {5, 9}, .kv_blocks = floor},               // above E
        wsa::Split{.slots = {5, 5}, .kv_blocks = floor - 1},           // below the floor
        wsa::Split{.slots = {5, 5}, .kv_blocks = most_blocks + 1}}) {  // over the budget
    EngineConfig c2 = base_config();
    const EngineConfig before = c2;
    const Status st = wsa::configure_auto_split(m->geometry, budget, floor, bad, c2);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << wsa::to_string(bad);
    EXPECT_EQ(c2.pager.layer_slots, before.pager.layer_slots);
    EXPECT_EQ(c2.kv.max_budget_bytes, before.kv.max_budget_bytes);
    EXPECT_EQ(c2.device_budget_bytes, before.device_budget_bytes);
  }
  EngineConfig fits = base_config();
  EXPECT_TRUE(wsa::configure_auto_split(m->geometry, budget, floor,
                                        {.slots = {5, 5}, .kv_blocks = most_blocks}, fits)
                  .ok());
}

}  // namespace
}  // namespace ferry::serve

namespace ferry::serve {
namespace {

// Agentic sessions that re-send their real history: turn t+1's prompt is turn t's prompt, the
// tokens turn t generated, then the workload's new user tokens. Records tokens and logits rows.
struct AgenticRecord {
  std::map<std::pair<int, int>, std::vector<std::int32_t>> tokens;
  std::map<std::pair<int, int>, std::vector<std::vector<float>>> logits;
};
AgenticRecord run_history(Engine& eng, const wsa::AgenticWorkload& w, int vocab) {
  AgenticRecord out;
  std::map<RequestId, std::pair<int, int>> turn_of;
  std::map<int, std::vector<std::int32_t>> prompt_of;  // by session: the last prompt sent
  eng.set_logits_observer([&](RequestId id, int, std::span<const float> row) {
    out.logits[turn_of.at(id)].emplace_back(row.begin(), row.end());
  });
  auto submit = [&](int s, int t, std::vector<std::int32_t> prompt) {
    prompt_of[s] = prompt;
    auto id = eng.submit(
        {.prompt = std::move(prompt), .max_new_tokens = w.turns(s)[std::size_t(t)].output});
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    if (id.ok()) turn_of[*id] = {s, t};
  };
  for (int s = 0; s < w.sessions(); ++s) submit(s, 0, w.turn_prompt(s, 0, vocab));
  while (!eng.idle()) {
    auto ev = eng.step();
    EXPECT_TRUE(ev.ok()) << ev.status().to_string();
    if (!ev.ok()) break;
    for (const TokenEvent& e : *ev) {
      if (e.finish == FinishReason::kNone) continue;
      EXPECT_EQ(e.finish, FinishReason::kLength);
      auto o = eng.take_output(e.id);
      EXPECT_TRUE(o.ok());
      const auto [s, t] = turn_of.at(e.id);
      out.tokens[{s, t}] = o->tokens;
      if (t + 1 >= static_cast<int>(w.turns(s).size())) continue;
      submit(s, t + 1, w.next_turn_prompt(s, t, prompt_of[s], o->tokens, vocab));
    }
  }
  eng.set_logits_observer(nullptr);
  return out;
}

TEST(WsaLive, ReusePriorKeepsHistoriesOnTheEngine) {
  // The engine's LiveSplit with and without the prefix reuse prior (LiveSplitConfig::
  // reuse_prior) on six sessions of three turns, more than max_running (3), with the prefix cache
  // and a budget that holds every history next to 4 (or 6) slots per layer: without the prior the
  // early decisions (only first turns seen, no chain back yet) trade cached histories for slots
  // and later turns recompute them; with it every history stays, as in a budget roomy enough for
  // 8 slots and every history, where neither has anything to trade.
  auto m = builtin();
  ASSERT_TRUE(m);
  wsa::AgenticSpec spec = tiny_agentic_spec();
  spec.sessions = 6;
  const wsa::AgenticWorkload w(spec);
  int history_blocks = 0;
  for (int s = 0; s < w.sessions(); ++s) history_blocks += (w.session_tokens(s) + 3) / 4 + 1;
  auto probe =
      KvCache::create(m->geometry, {.block_tokens = kBlockTokens, .budget_bytes = 1 << 20});
  ASSERT_TRUE(probe.ok());
  const std::size_t kb = (*probe)->block_bytes();
  const std::size_t eb = 3 * 64 * 32 * sizeof(float);
  const int floor = (w.max_context() + kBlockTokens - 1) / kBlockTokens;
  struct Counts {
    std::uint64_t hits = 0, prefill = 0;
  };
  auto run = [&](int slots, bool prior) -> Counts {
    EngineConfig cfg = base_config();
    cfg.kv.prefix_cache = true;
    const std::size_t budget = 2 * std::size_t(slots) * eb + std::size_t(history_blocks) * kb;
    EXPECT_TRUE(wsa::configure_auto_split(m->geometry, budget, floor, cfg).ok());
    auto b = Engine::create(m->geometry, m->params, cfg);
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    if (!b.ok()) return {};
    auto ls = wsa::LiveSplit::attach(**b, {.budget_bytes = budget,
                                           .concurrency = 1,
                                           .max_context_tokens = w.max_context(),
                                           .decide_every_steps = 2,
                                           .link_bytes_per_s = 1e9,
                                           .reuse_prior = prior});
    EXPECT_TRUE(ls.ok()) << ls.status().to_string();
    if (!ls.ok()) return {};
    run_history(**b, w, m->geometry.vocab);
    EXPECT_GT((*ls)->stats().moves, 0u);
    EXPECT_LE((*b)->device_budget().bytes_peak(), budget);
    return {(*b)->stats().prefix_hit_tokens, (*b)->stats().prefill_tokens};
  };
  const Counts all = run(8, false);
  EXPECT_EQ(run(8, true).hits, all.hits);
  for (int slots : {4, 6}) {
    const Counts without = run(slots, false), with = run(slots, true);
    EXPECT_LT(without.hits, all.hits) << slots;  // the trade the prior prevents happens
    EXPECT_EQ(with.hits, all.hits) << slots;
    EXPECT_EQ(with.prefill, all.prefill) << slots;
    std::printf(
        "reuse prior, %d slots: hit tokens %llu (without the prior %llu), prefill %llu (%llu)\n",
        slots, static_cast<unsigned long long>(with.hits),
        static_cast<unsigned long long>(without.hits),
        static_cast<unsigned long long>(with.prefill),
        static_cast<unsigned long long>(without.prefill));
  }
}

TEST(WsaLive, PrefixCacheUnderAutoSplitIsBitIdenticalAndFeedsTheKvCurve) {
  auto m = builtin();
  ASSERT_TRUE(m);
  const wsa::AgenticWorkload w(tiny_agentic_spec());
  EngineConfig roomy = base_config();
  roomy.pager.slots_per_layer = 8;
  roomy.kv = {.block_tokens = kBlockTokens, .budget_bytes = 8 << 20};
  roomy.batch_invariant = true;
  auto a = Engine::create(m->geometry, m->params, roomy);
  ASSERT_TRUE(a.ok());
  const AgenticRecord want = run_history(**a, w, m->geometry.vocab);

  EngineConfig cfg = base_config();
  cfg.kv.prefix_cache = true;
  cfg.batch_invariant = true;
  const auto [floor, budget] = tight_split(*m, w);
  ASSERT_GT(budget, 0u);
  ASSERT_TRUE(wsa::configure_auto_split(m->geometry, budget, floor, cfg).ok());
  auto b = Engine::create(m->geometry, m->params, cfg);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto ls = wsa::LiveSplit::attach(**b, {.budget_bytes = budget,
                                         .concurrency = 1,
                                         .max_context_tokens = w.max_context(),
                                         .decide_every_steps = 2,
                                         .link_bytes_per_s = 1e9});
  ASSERT_TRUE(ls.ok()) << ls.status().to_string();
  const AgenticRecord got = run_history(**b, w, m->geometry.vocab);
  ASSERT_EQ(got.tokens.size(), std::size_t(4 * 3));
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (const auto& [turn, rows] : want.logits) {
    const auto& other = got.logits.at(turn);
    ASSERT_EQ(rows.size(), other.size());
    for (std::size_t r = 0; r < rows.size(); ++r) {
      EXPECT_TRUE(testing::same_bits(rows[r], other[r]))
          << "session " << turn.first << " turn " << turn.second << " row " << r;
    }
  }
  EXPECT_GT((*b)->stats().prefix_hit_tokens, 0u);
  EXPECT_GT((*ls)->stats().decisions, 0u);
  EXPECT_EQ((*ls)->stats().priced_by_caps, 0u);  // ControllerConfig::price_by_caps is off
  EXPECT_LE((*b)->device_budget().bytes_peak(), budget);
  const wsa::SplitProblem p = (*ls)->problem(**b);
  ASSERT_FALSE(p.kv_prefix_misses.empty());
  EXPECT_GT(p.prefix_block_cost_s, 0);
  EXPECT_GT(p.kv_prefix_misses.front(), 0);
  std::printf(
      "agentic auto split + prefix cache: hit tokens=%llu/%llu preemptions=%llu moves=%llu\n",
      static_cast<unsigned long long>((*b)->stats().prefix_hit_tokens),
      static_cast<unsigned long long>((*b)->stats().prefix_query_tokens),
      static_cast<unsigned long long>((*b)->stats().preemptions),
      static_cast<unsigned long long>((*ls)->stats().moves));
}

}  // namespace
}  // namespace ferry::serve
