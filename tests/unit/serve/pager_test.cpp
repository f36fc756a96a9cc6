// SPDX-License-Identifier: Apache-2.0
// Expert pager properties, driven by seeded random access streams over a small store:
//   - resident bytes <= budget after every transition;
//   - a hit never copies (bytes_copied moves only by misses * expert_bytes);
//   - the current working set (in-use) and the hot set are never evicted;
//   - every slot transition is legal (the observer sees all of them);
//   - the slow twin: victim choice equals a plain reference LRU / LFU written in the test;
//   - errors: a budget below top-k experts per layer, an unknown mode or policy.
#include <algorithm>
#include <cstring>
#include <list>
#include <map>
#include <set>

#include "mem/stream.h"
#include "serve/builtin_model.h"
#include "serve/expert_executor.h"
#include "serve/expert_pager.h"
#include "serve/sampler.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

std::unique_ptr<BuiltinModel> small_model() {
  auto m = make_builtin_moe({.vocab = 64,
                             .layers = 2,
                             .hidden = 32,
                             .heads = 2,
                             .kv_heads = 1,
                             .head_dim = 16,
                             .experts = 8,
                             .top_k = 2,
                             .expert_width = 16},
                            7);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

// A random group of `n` distinct experts of [0, E).
std::vector<std::int32_t> random_group(Rng& rng, int E, int n) {
  std::vector<std::int32_t> all(E);
  for (int e = 0; e < E; ++e) all[e] = e;
  for (int i = E - 1; i > 0; --i) std::swap(all[i], all[rng.next() % (i + 1)]);
  all.resize(n);
  return all;
}

class PagerProperties : public ::testing::TestWithParam<EvictionPolicy> {};

TEST_P(PagerProperties, InvariantsHoldOnRandomStreams) {
  auto m = small_model();
  ASSERT_TRUE(m);
  auto store = ExpertStore::create(m->geometry, m->params);
  ASSERT_TRUE(store.ok());
  const std::size_t eb = (*store)->expert_bytes();
  for (int cap : {2, 3, 5, 8}) {
    const std::vector<int> caps = {cap, std::max(2, cap - 1)};  // per-layer caps differ
    PagerSetup setup{.caps = caps, .policy = GetParam(), .hot = {{}, {}}};
    if (cap >= 3) setup.hot = {{6}, {}};
    auto pager = ExpertPager::create(**store, setup);
    ASSERT_TRUE(pager.ok()) << pager.status().to_string();
    ExpertPager& p = **pager;
    const std::size_t budget = p.budget().bytes_limit();
    EXPECT_EQ(budget, std::size_t(caps[0] + caps[1]) * eb);
    std::set<std::pair<int, int>> working;  // (layer, expert) of the current acquire
    int illegal = 0, evicted_working = 0, evicted_hot = 0, over_budget = 0, out_of_order = 0;
    // Each slot's events must chain: an event starts in the state the previous one ended in.
    std::map<std::pair<int, int>, ExpertSlotState> last;
    for (int l = 0; l < 2; ++l) {
      for (int s = 0; s < p.capacity(l); ++s) last[{l, s}] = p.state(l, s);
    }
    p.set_observer([&](const SlotEvent& ev) {
      illegal += !is_legal_slot_transition(ev.from, ev.to);
      out_of_order += last[{ev.layer, ev.slot}] != ev.from;
      last[{ev.layer, ev.slot}] = ev.to;
      if (ev.to == ExpertSlotState::kEmpty) {
        evicted_working += working.count({ev.layer, ev.expert}) != 0;
        evicted_hot += p.is_hot(ev.layer, ev.expert);
      }
      over_budget += p.resident_bytes() > budget;
    });
    Rng rng(cap * 1000 + static_cast<int>(GetParam()));
    for (int it = 0; it < 400; ++it) {
      const int layer = static_cast<int>(rng.next() % 2);
      const int n = 1 + static_cast<int>(rng.next() % p.group_limit(layer));
      std::vector<std::int32_t> group = random_group(rng, 8, n);
      // Which of them are hits right now?
      int hits = 0;
      for (std::int32_t e : group) {
        for (int s = 0; s < p.capacity(layer); ++s) hits += p.expert_in(layer, s) == e;
      }
      const PagerCounters before = p.counters();
      working.clear();
      for (std::int32_t e : group) working.insert({layer, e});
      std::vector<ExpertRef> refs(group.size());
      ASSERT_TRUE(p.acquire(layer, group, refs).ok());
      const PagerCounters after = p.counters();
      EXPECT_EQ(after.hits - before.hits, std::uint64_t(hits));
      EXPECT_EQ(after.bytes_copied - before.bytes_copied,
                std::uint64_t(int(group.size()) - hits) * eb)
          << "a hit copied, or a miss did not";
      // The refs point at slot copies holding exactly the host bytes.
      for (std::size_t i = 0; i < group.size(); ++i) {
        EXPECT_EQ(std::memcmp(refs[i].gate, (*store)->block(layer, group[i]), eb), 0);
      }
      p.release(layer);
    }
    EXPECT_EQ(illegal, 0);
    EXPECT_EQ(out_of_order, 0);
    EXPECT_EQ(evicted_working, 0);
    EXPECT_EQ(evicted_hot, 0);
    EXPECT_EQ(over_budget, 0);
    EXPECT_LE(p.resident_bytes(), budget);
    if (cap < 8) {
      EXPECT_GT(p.counters().evictions, 0u) << "cap " << cap;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, PagerProperties,
                         ::testing::Values(EvictionPolicy::kLru, EvictionPolicy::kLfu,
                                           EvictionPolicy::kLfru),
                         [](const auto& pi) { return std::string(to_string(pi.param)); });

// Slow twin: a plain LRU / LFU cache of one layer, written without slots, must evict the same
// experts (so hit/miss sequences agree) on single-expert accesses.
TEST(PagerTwin, VictimsMatchPlainReferenceCaches) {
  auto m = small_model();
  ASSERT_TRUE(m);
  auto store = ExpertStore::create(m->geometry, m->params);
  ASSERT_TRUE(store.ok());
  for (EvictionPolicy policy : {EvictionPolicy::kLru, EvictionPolicy::kLfu}) {
    const int cap = 3;
    auto pager = ExpertPager::create(**store, {.caps = {cap, cap}, .policy = policy});
    ASSERT_TRUE(pager.ok());
    // Reference: expert -> (last use, uses since load).
    std::map<int, std::pair<int, int>> ref;
    Rng rng(99);
    for (int t = 1; t <= 500; ++t) {
      const auto e =
          static_cast<std::int32_t>(rng.next() % 8 < 5 ? rng.next() % 3 : rng.next() % 8);
      bool ref_hit = ref.count(e) != 0;
      if (ref_hit) {
        ref[e] = {t, ref[e].second + 1};
      } else {
        if (static_cast<int>(ref.size()) == cap) {
          auto victim = ref.begin();
          for (auto it = ref.begin(); it != ref.end(); ++it) {
            const auto key = [&](const auto& x) {
              return policy == EvictionPolicy::kLru
                         ? std::make_pair(x->second.first, 0)
                         : std::make_pair(x->second.second, x->second.first);
            };
            if (key(it) < key(victim)) victim = it;
          }
          ref.erase(victim);
        }
        ref[e] = {t, 1};
      }
      const std::uint64_t hits_before = (*pager)->counters().hits;
      ExpertRef r;
      ASSERT_TRUE(
          (*pager)
              ->acquire(0, std::span<const std::int32_t>(&e, 1), std::span<ExpertRef>(&r, 1))
              .ok());
      (*pager)->release(0);
      const bool hit = (*pager)->counters().hits > hits_before;
      ASSERT_EQ(hit, ref_hit) << to_string(policy) << " access " << t << " expert " << e;
    }
  }
}

TEST(PagerStates, ExactlyTheSixTransitionsAreLegal) {
  using S = ExpertSlotState;
  const S all[] = {S::kEmpty, S::kLoading, S::kResident, S::kInUse};
  const std::set<std::pair<S, S>> legal = {{S::kEmpty, S::kLoading},    {S::kLoading, S::kInUse},
                                           {S::kLoading, S::kResident}, {S::kResident, S::kInUse},
                                           {S::kInUse, S::kResident},   {S::kResident, S::kEmpty}};
  for (S a : all) {
    for (S b : all) {
      EXPECT_EQ(is_legal_slot_transition(a, b), legal.count({a, b}) == 1)
          << to_string(a) << " -> " << to_string(b);
    }
  }
}

TEST(PagerErrors, BudgetBelowTopKIsAClearError) {
  auto m = small_model();
  ASSERT_TRUE(m);
  auto store = ExpertStore::create(m->geometry, m->params);
  ASSERT_TRUE(store.ok());
  PagerConfig pc{.mode = ExpertMode::kPaged, .budget_bytes = (*store)->expert_bytes() * 3};
  // 3 experts over 2 MoE layers = 1 per layer < top-k 2.
  auto ex = ExpertExecutor::create(m->geometry, m->params, pc);
  ASSERT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(ex.status().to_string().find("fewer than top-k"), std::string::npos)
      << ex.status().to_string();
  // Explicit slots that do not fit the budget.
  pc = {.mode = ExpertMode::kPaged,
        .slots_per_layer = 4,
        .budget_bytes = (*store)->expert_bytes() * 7};
  ex = ExpertExecutor::create(m->geometry, m->params, pc);
  ASSERT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), StatusCode::kResourceExhausted);
  // Static mode needs a whole layer.
  pc = {.mode = ExpertMode::kStatic, .budget_bytes = (*store)->expert_bytes() * 7};
  ex = ExpertExecutor::create(m->geometry, m->params, pc);
  ASSERT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), StatusCode::kResourceExhausted);
  // A hot set that leaves fewer than top-k free slots.
  pc = {.mode = ExpertMode::kPaged, .slots_per_layer = 3, .hot_experts = {{0, 1}, {}}};
  ex = ExpertExecutor::create(m->geometry, m->params, pc);
  ASSERT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ex.status().to_string().find("hot"), std::string::npos) << ex.status().to_string();
  // Budget exactly top-k per layer works.
  pc = {.mode = ExpertMode::kPaged, .budget_bytes = (*store)->expert_bytes() * 4};
  ex = ExpertExecutor::create(m->geometry, m->params, pc);
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  EXPECT_EQ((*ex)->pager()->capacity(0), 2);
}

TEST(PagerErrors, UnknownModeAndPolicy) {
  auto mode = parse_expert_mode("gpu-magic");
  ASSERT_FALSE(mode.ok());
  EXPECT_EQ(mode.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mode.status().to_string().find("unknown expert mode"), std::string::npos);
  EXPECT_FALSE(parse_eviction_policy("fifo").ok());
  EXPECT_EQ(*parse_expert_mode("cpu-experts"), ExpertMode::kCpuExperts);
}

TEST(PagerGroups, ExpertGroupsHoldEveryExpertOnceResidentFirstWithinTheLimit) {
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int E = 12, K = 3, T = 1 + static_cast<int>(rng.next() % 24);
    const int limit = K + static_cast<int>(rng.next() % (E - K + 1));
    std::vector<std::int32_t> ids;
    for (int t = 0; t < T; ++t) {
      auto g = random_group(rng, E, K);
      ids.insert(ids.end(), g.begin(), g.end());
    }
    std::vector<bool> hot(E, false), resident(E, false);
    for (int e = 0; e < E; ++e) {
      hot[e] = rng.next() % 6 == 0;
      resident[e] = rng.next() % 3 == 0;
    }
    std::vector<int> group_of;
    const int groups = split_expert_groups(ids, E, limit, hot, resident, group_of);
    std::set<int> routed(ids.begin(), ids.end());
    std::vector<int> non_hot(static_cast<std::size_t>(groups), 0);
    int last_resident_group = 0, first_missing_group = groups;
    for (int e = 0; e < E; ++e) {
      const int g = group_of[e];
      if (!routed.count(e)) {
        EXPECT_EQ(g, -1);
        continue;
      }
      ASSERT_GE(g, 0);
      ASSERT_LT(g, groups);
      if (hot[e]) continue;
      ++non_hot[static_cast<std::size_t>(g)];
      if (resident[e]) last_resident_group = std::max(last_resident_group, g);
      if (!resident[e]) first_missing_group = std::min(first_missing_group, g);
    }
    for (int n : non_hot) EXPECT_LE(n, limit);
    // Resident experts fill the first groups; a miss never precedes a resident expert's group.
    EXPECT_LE(last_resident_group, first_missing_group);
    // Groups are full but the last: no more groups than needed.
    int total = 0;
    for (int n : non_hot) total += n;
    EXPECT_EQ(groups, std::max(1, (total + limit - 1) / limit));
    // The groups' rows partition the step's rows, each in routing order.
    std::vector<int> seen(ids.size(), 0);
    std::vector<std::int32_t> rows;
    for (int g = 0; g < groups; ++g) {
      rows_of_group(ids, group_of, g, rows);
      EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
      for (std::int32_t i : rows) ++seen[static_cast<std::size_t>(i)];
    }
    for (int n : seen) EXPECT_EQ(n, 1);
  }
}

TEST(PagerGroups, SplitKeepsEveryGroupWithinTheLimit) {
  Rng rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int E = 8, K = 2, T = 1 + static_cast<int>(rng.next() % 20);
    const int limit = K + static_cast<int>(rng.next() % (E - K + 1));
    std::vector<std::int32_t> ids;
    for (int t = 0; t < T; ++t) {
      auto g = random_group(rng, E, K);
      ids.insert(ids.end(), g.begin(), g.end());
    }
    const auto ends = split_token_groups(ids, T, K, E, limit, {});
    ASSERT_FALSE(ends.empty());
    EXPECT_EQ(ends.back(), T);
    std::int64_t t0 = 0;
    for (std::size_t gi = 0; gi < ends.size(); ++gi) {
      std::set<int> d(ids.begin() + t0 * K, ids.begin() + ends[gi] * K);
      EXPECT_LE(static_cast<int>(d.size()), limit);
      // Greedy: the next token would not have fit (groups are maximal).
      if (gi + 1 < ends.size()) {
        std::set<int> d2(ids.begin() + t0 * K, ids.begin() + (ends[gi] + 1) * K);
        EXPECT_GT(static_cast<int>(d2.size()), limit);
      }
      t0 = ends[gi];
    }
  }
}

// acquire()'s copy_index: -1 for a hit, else the expert's place in the batch's copy order, which
// is the order of the copies (bytes_copied grows by one block per copy) — what the CUDA executor
// waits on per expert (wait_copy) to run a missed expert's rows as soon as its copy lands.
TEST(PagerCopies, CopyIndexNamesEachMissInBatchOrder) {
  auto m = small_model();
  ASSERT_TRUE(m);
  auto store = ExpertStore::create(m->geometry, m->params);
  ASSERT_TRUE(store.ok());
  auto pager = ExpertPager::create(**store, {.caps = {3, 3}});
  ASSERT_TRUE(pager.ok()) << pager.status().to_string();
  ExpertPager& p = **pager;
  const std::size_t eb = (*store)->expert_bytes();
  std::vector<ExpertRef> refs(3);
  std::vector<int> copy(3, 7);
  const std::vector<std::int32_t> first = {5, 2, 6};
  ASSERT_TRUE(p.acquire(0, first, refs, copy).ok());
  EXPECT_EQ(copy, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(p.counters().bytes_copied, 3 * eb);
  for (int j = 0; j < 3; ++j) EXPECT_TRUE(p.wait_copy(j, mem::Stream::host()).ok());
  p.release(0);
  // 2 and 6 hit; 1 evicts LRU's victim (5) and is the batch's only copy.
  const std::vector<std::int32_t> second = {2, 1, 6};
  ASSERT_TRUE(p.acquire(0, second, refs, copy).ok());
  EXPECT_EQ(copy, (std::vector<int>{-1, 0, -1}));
  EXPECT_EQ(p.counters().bytes_copied, 4 * eb);
  EXPECT_FALSE(p.is_resident(0, 5));
  // The slot the copy landed in holds expert 1's block.
  EXPECT_EQ(std::memcmp(refs[1].gate, (*store)->block(0, 1), eb), 0);
  p.release(0);
  // All hits: nothing to wait for.
  ASSERT_TRUE(p.acquire(0, second, refs, copy).ok());
  EXPECT_EQ(copy, (std::vector<int>{-1, -1, -1}));
  EXPECT_EQ(p.counters().bytes_copied, 4 * eb);
  p.release(0);
}

TEST(PagerCopies, OverlapNeedsADevicePagerAndWaitsAreChecked) {
  auto m = small_model();
  ASSERT_TRUE(m);
  auto store = ExpertStore::create(m->geometry, m->params);
  ASSERT_TRUE(store.ok());
  auto host_overlap = ExpertPager::create(**store, {.caps = {3, 3}, .overlap = true});
  ASSERT_FALSE(host_overlap.ok());
  EXPECT_EQ(host_overlap.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(host_overlap.status().message().find("device pager"), std::string::npos)
      << host_overlap.status().message();
  auto pager = ExpertPager::create(**store, {.caps = {3, 3}});
  ASSERT_TRUE(pager.ok());
  std::vector<ExpertRef> refs(2);
  std::vector<int> copy(2);
  const std::vector<std::int32_t> ids = {0, 1};
  ASSERT_TRUE((*pager)->acquire(1, ids, refs, copy).ok());
  // A copy index outside the last batch is a caller bug.
  EXPECT_DEATH((void)(*pager)->wait_copy(2, mem::Stream::host()), "wait_copy");
  (*pager)->release(1);
}

// The paged CUDA executor's launch order: every row of the group exactly once, resident experts'
// rows first, then one segment per copy holding only that copy's expert, each in routing order.
TEST(PagerGroups, RowsByReadinessCoverEveryRowOnceHitsFirst) {
  Rng rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int E = 12, K = 3, T = 1 + static_cast<int>(rng.next() % 9);
    std::vector<std::int32_t> ids;
    for (int t = 0; t < T; ++t) {
      auto g = random_group(rng, E, K);
      ids.insert(ids.end(), g.begin(), g.end());
    }
    const std::int64_t t0 = static_cast<std::int64_t>(rng.next() % std::uint64_t(T));
    const std::int64_t i0 = t0 * K, i1 = std::int64_t(T) * K;
    // The group's distinct experts, a random subset of them copied in a random order.
    std::vector<std::int32_t> distinct;
    for (std::int64_t i = i0; i < i1; ++i) {
      if (std::find(distinct.begin(), distinct.end(), ids[i]) == distinct.end())
        distinct.push_back(ids[i]);
    }
    std::vector<int> copy_of(E, 5);  // junk for experts outside the group: must not be read
    std::vector<std::int32_t> copies;
    for (std::int32_t e : distinct) {
      copy_of[e] = -1;
      if (rng.next() % 2) copies.push_back(e);
    }
    for (std::size_t j = copies.size(); j > 1; --j)
      std::swap(copies[j - 1], copies[rng.next() % j]);
    for (std::size_t j = 0; j < copies.size(); ++j) copy_of[copies[j]] = int(j);
    std::vector<std::int32_t> out(std::size_t(i1 - i0), -1);
    std::vector<std::int64_t> seg;
    const std::int64_t hits =
        order_rows_by_readiness(ids, i0, i1, copy_of, copies, out.data(), seg);
    ASSERT_EQ(seg.size(), copies.size());
    std::vector<std::int32_t> sorted = out;
    std::sort(sorted.begin(), sorted.end());
    for (std::int64_t i = i0; i < i1; ++i) ASSERT_EQ(sorted[std::size_t(i - i0)], i) << trial;
    for (std::int64_t p = 0; p < hits; ++p) {
      EXPECT_LT(copy_of[ids[out[p]]], 0);
      if (p > 0) {
        EXPECT_LT(out[p - 1], out[p]);
      }
    }
    std::int64_t begin = hits;
    for (std::size_t j = 0; j < copies.size(); ++j) {
      EXPECT_GT(seg[j], begin) << "copy " << j << " has no rows";
      for (std::int64_t p = begin; p < seg[j]; ++p) {
        EXPECT_EQ(ids[out[p]], copies[j]);
        if (p > begin) {
          EXPECT_LT(out[p - 1], out[p]);
        }
      }
      begin = seg[j];
    }
    EXPECT_EQ(begin, i1 - i0);
  }
}

}  // namespace
}  // namespace ferry::serve
