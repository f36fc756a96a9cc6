// SPDX-License-Identifier: Apache-2.0
// Automatic prefix caching (kv_cache.h, engine.h):
//   - engine: multi-turn sessions that re-send their history and requests sharing a system
//     prompt give the same token ids and the same logits bits with the prefix cache as without it
//     (both batch-invariant), while computing fewer prefill tokens; without batch invariance the
//     tokens still agree;
//   - KvCache: a match is exact and block-aligned and leaves the last token to compute; chains
//     are verified through the parent (same block content after a different prefix: no match);
//     eviction under pressure takes cached blocks tail first, least recently released first,
//     never a referenced one; a shared block stays intact while any table holds it; a resize
//     drops only unreferenced cached blocks (as few as needed) and moves referenced ones with
//     their rows and identity.
#include <numeric>

#include "serve/pool_tier.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

constexpr int kBt = 8;  // block tokens

std::unique_ptr<BuiltinModel> builtin() { return testing::tiny_builtin_moe(23); }

EngineConfig config(bool prefix, bool invariant, std::size_t kv_bytes = 1 << 20) {
  EngineConfig cfg;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.pager.slots_per_layer = 3;
  cfg.max_batch_tokens = 16;
  cfg.max_running = 3;
  cfg.kv = {.block_tokens = kBt, .budget_bytes = kv_bytes, .prefix_cache = prefix};
  cfg.batch_invariant = invariant;
  return cfg;
}

std::vector<std::int32_t> ids(int n, int salt) {
  std::vector<std::int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 11 + 5) % 256);
  return p;
}
std::vector<std::int32_t> cat(std::vector<std::int32_t> a, const std::vector<std::int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct TurnRun {
  testing::RunRecord rec;  // keyed by submission order, not request id
  EngineStats stats;
};

// Three rounds: sessions 0..2 with private prefixes (one sampled), two requests sharing a system
// prompt; each later round re-sends every session's whole history plus new user tokens.
Result<TurnRun> run_turns(Engine& eng) {
  TurnRun out;
  const std::vector<std::int32_t> system = ids(21, 99);
  std::vector<std::vector<std::int32_t>> history = {ids(27, 1), ids(19, 2), ids(33, 3),
                                                    cat(system, ids(6, 4)), cat(system, ids(9, 5))};
  int key = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<GenerationRequest> reqs;
    for (std::size_t s = 0; s < history.size(); ++s) {
      if (round > 0) history[s] = cat(history[s], ids(5 + int(s), 10 * round + int(s)));
      GenerationRequest r{.prompt = history[s], .max_new_tokens = 6 + int(s) % 3};
      if (s == 1) r.sampling = {.temperature = 0.8f, .top_k = 20, .seed = 7 + round};
      reqs.push_back(r);
    }
    FERRY_ASSIGN_OR_RETURN(testing::RunRecord rec, testing::run_engine(eng, reqs));
    int s = 0;
    for (auto& [id, toks] : rec.tokens) {
      history[std::size_t(s)] = cat(history[std::size_t(s)], toks);
      out.rec.tokens[key] = toks;
      out.rec.logits[key] = rec.logits[id];
      ++key, ++s;
    }
  }
  out.stats = eng.stats();
  return out;
}

TEST(PrefixCache, OutputsBitIdenticalToNoCacheWithFewerPrefillTokens) {
  auto m = builtin();
  ASSERT_TRUE(m);
  auto plain = Engine::create(m->geometry, m->params, config(false, true));
  auto cached = Engine::create(m->geometry, m->params, config(true, true));
  ASSERT_TRUE(plain.ok() && cached.ok());
  auto a = run_turns(**plain);
  auto b = run_turns(**cached);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_EQ(a->rec.tokens.size(), 15u);
  EXPECT_EQ(a->rec.tokens, b->rec.tokens);
  for (const auto& [k, rows] : a->rec.logits) {
    const auto& other = b->rec.logits.at(k);
    ASSERT_EQ(rows.size(), other.size()) << k;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      EXPECT_TRUE(testing::same_bits(rows[r], other[r])) << "request " << k << " row " << r;
    }
  }
  // The cache was really used: later rounds matched their history, round 0 the system prompt.
  EXPECT_EQ(a->stats.prefix_hit_tokens, 0u);
  EXPECT_GT(b->stats.prefix_hit_tokens, 150u);
  EXPECT_EQ(a->stats.prefill_tokens, b->stats.prefill_tokens + b->stats.prefix_hit_tokens);
  EXPECT_EQ(a->stats.decode_tokens, b->stats.decode_tokens);
  EXPECT_GT(b->stats.prefix_hit_rate(), 0.3);
  EXPECT_EQ((*cached)->kv().used_blocks(), 0);
  EXPECT_GT((*cached)->kv().cached_blocks(), 0);
}

TEST(PrefixCache, WithoutBatchInvarianceTokensStillAgree) {
  auto m = builtin();
  ASSERT_TRUE(m);
  auto plain = Engine::create(m->geometry, m->params, config(false, false));
  auto cached = Engine::create(m->geometry, m->params, config(true, false));
  ASSERT_TRUE(plain.ok() && cached.ok());
  auto a = run_turns(**plain);
  auto b = run_turns(**cached);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->rec.tokens, b->rec.tokens);
  EXPECT_GT(b->stats.prefix_hit_tokens, 0u);
}

TEST(PrefixCache, EngineUnderKvPressureEvictsAndStaysCorrect) {
  auto m = builtin();
  ASSERT_TRUE(m);
  auto probe = KvCache::create(m->geometry, {.block_tokens = kBt, .budget_bytes = 1 << 20});
  ASSERT_TRUE(probe.ok());
  // 14 blocks: the rounds' histories (up to ~8 blocks each) cannot all stay cached.
  const std::size_t small = 14 * (*probe)->block_bytes();
  auto plain = Engine::create(m->geometry, m->params, config(false, true));
  auto tight = Engine::create(m->geometry, m->params, config(true, true, small));
  ASSERT_TRUE(plain.ok() && tight.ok());
  ASSERT_EQ((*tight)->kv().num_blocks(), 14);
  auto a = run_turns(**plain);
  auto b = run_turns(**tight);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
  EXPECT_EQ(a->rec, b->rec);  // tokens and logits bits
  EXPECT_GT((*tight)->kv().prefix_counters().evictions, 0u);
  EXPECT_GT(b->stats.prefix_hit_tokens, 0u);
  EXPECT_LT(b->stats.prefix_hit_tokens, b->stats.prefix_query_tokens);
  EXPECT_LE((*tight)->stats().kv_blocks_peak, 14);
}

// --- KvCache units -------------------------------------------------------------------------

struct Pool {
  std::unique_ptr<BuiltinModel> model = builtin();
  std::unique_ptr<KvCache> kv;
  std::size_t block_bytes = 0;
  explicit Pool(int blocks, int max_blocks = 0) {
    auto probe = KvCache::create(model->geometry, {.block_tokens = kBt, .budget_bytes = 1 << 20});
    EXPECT_TRUE(probe.ok());
    block_bytes = (*probe)->block_bytes();
    auto c =
        KvCache::create(model->geometry, {.block_tokens = kBt,
                                          .budget_bytes = std::size_t(blocks) * block_bytes,
                                          .max_budget_bytes = std::size_t(max_blocks) * block_bytes,
                                          .prefix_cache = true});
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    kv = std::move(*c);
  }
  // Reserves, "computes" (writes a pattern into every K row) and commits `tokens`.
  BlockTable fill(const std::vector<std::int32_t>& tokens, float tag) {
    BlockTable t;
    const int hit = kv->match_prefix(t, tokens);
    EXPECT_TRUE(kv->reserve(t, std::int64_t(tokens.size())).ok());
    for (std::int64_t p = std::int64_t(hit) * kBt; p < std::int64_t(tokens.size()); ++p) {
      kv->k_row(0, t, p)[0] = tag + float(p);
    }
    kv->commit_full_blocks(t, tokens, std::int64_t(tokens.size()));
    return t;
  }
};

TEST(PrefixCache, MatchIsExactBlockAlignedAndChained) {
  Pool pool(16);
  KvCache& kv = *pool.kv;
  const auto a = ids(3 * kBt + 5, 1);  // 3 full blocks + 5
  BlockTable ta = pool.fill(a, 1000);
  EXPECT_EQ(ta.identified, 3);  // the partial block has no identity
  kv.release(ta);
  EXPECT_EQ(kv.cached_blocks(), 3);
  EXPECT_EQ(kv.used_blocks(), 0);
  // The same prompt matches its 3 full blocks; the same 3 blocks alone match only 2 (the last
  // token is always computed).
  BlockTable t;
  EXPECT_EQ(kv.match_prefix(t, a), 3);
  for (int p = 0; p < 3 * kBt; ++p) EXPECT_EQ(kv.k_row(0, t, p)[0], 1000.0f + float(p));
  kv.release(t);
  EXPECT_EQ(kv.match_prefix(t, std::span(a).first(3 * kBt)), 2);
  kv.release(t);
  // One token changed in block 1: blocks 0 matches, nothing after it.
  auto b = a;
  b[kBt + 3] ^= 1;
  EXPECT_EQ(kv.match_prefix(t, b), 1);
  kv.release(t);
  // A different block 0: block 1's own tokens are the same, but its hash is chained through
  // block 0, so nothing matches.
  auto c = a;
  c[0] ^= 1;
  EXPECT_EQ(kv.match_prefix(t, c), 0);
  EXPECT_TRUE(t.blocks.empty());
  EXPECT_EQ(kv.prefix_counters().hit_blocks, 3u + 2u + 1u);
}

TEST(PrefixCache, CachedPrefixBlocksPeeksWhatAMatchWouldTakeAndTakesNothing) {
  Pool pool(16);
  KvCache& kv = *pool.kv;
  const auto a = ids(3 * kBt + 5, 1);
  BlockTable ta = pool.fill(a, 1000);
  kv.release(ta);
  auto b = a;
  b[kBt + 3] ^= 1;  // block 1 differs: only block 0 is found
  for (const auto& tokens :
       {a, b, ids(2 * kBt, 7), std::vector<std::int32_t>(a.begin(), a.begin() + 3 * kBt)}) {
    const PrefixCacheCounters before = kv.prefix_counters();
    const int cached = kv.cached_blocks(), free = kv.free_blocks();
    const int peek = kv.cached_prefix_blocks(tokens);
    // Nothing taken: no reference, no lookup counted.
    EXPECT_EQ(kv.cached_blocks(), cached);
    EXPECT_EQ(kv.free_blocks(), free);
    EXPECT_EQ(kv.prefix_counters().lookups, before.lookups);
    EXPECT_EQ(kv.prefix_counters().hit_blocks, before.hit_blocks);
    BlockTable t;
    EXPECT_EQ(peek, kv.match_prefix(t, tokens));  // what a match then hands over
    kv.release(t);
  }
  EXPECT_EQ(kv.cached_prefix_blocks(a), 3);
  EXPECT_EQ(kv.cached_prefix_blocks(b), 1);
  EXPECT_EQ(kv.cached_prefix_blocks({}), 0);
}

TEST(PrefixCache, KvDemandCountsAWaitingRequestBeyondItsCachedPrefix) {
  // Engine::final_blocks (MV-WSA's reuse prior): a waiting request adds the blocks
  // it will hold once run less the prefix it finds cached -- a new prompt counts whole, a prompt
  // whose history is cached only its uncached tail and new tokens.
  auto m = builtin();
  ASSERT_TRUE(m);
  EngineConfig cfg = config(/*prefix=*/true, /*invariant=*/false);
  cfg.max_running = 1;
  auto e = Engine::create(m->geometry, m->params, cfg);
  ASSERT_TRUE(e.ok());
  Engine& eng = **e;
  const auto history = ids(4 * kBt + 3, 1);
  ASSERT_TRUE(testing::run_engine(eng, {{.prompt = history, .max_new_tokens = 2}}).ok());
  ASSERT_EQ(eng.kv().cached_blocks(), 4);  // the history's 4 full blocks
  // One running request keeps both others waiting.
  const auto running = ids(2 * kBt + 1, 9);
  const auto fresh = ids(3 * kBt + 2, 5);            // nothing cached
  const auto again = cat(history, ids(kBt + 4, 6));  // its first 4 blocks cached
  ASSERT_TRUE(eng.submit({.prompt = running, .max_new_tokens = 3}).ok());
  ASSERT_TRUE(eng.step().ok());  // admits `running` only (max_running 1)
  ASSERT_TRUE(eng.submit({.prompt = fresh, .max_new_tokens = 4}).ok());
  ASSERT_TRUE(eng.submit({.prompt = again, .max_new_tokens = 5}).ok());
  const KvCache& kv = eng.kv();
  const int want = kv.blocks_for(std::int64_t(running.size()) + 3) +
                   kv.blocks_for(std::int64_t(fresh.size()) + 4) +
                   kv.blocks_for(std::int64_t(again.size()) + 5) - 4;
  EXPECT_EQ(eng.final_blocks(), want);
}

TEST(PrefixCache, EvictionUnderPressureIsLruTailFirstAndNeverTakesReferencedBlocks) {
  Pool pool(10);
  KvCache& kv = *pool.kv;
  const auto a = ids(4 * kBt + 1, 1), b = ids(3 * kBt + 1, 2);
  BlockTable ta = pool.fill(a, 1000);  // 5 blocks, 4 identified
  BlockTable tb = pool.fill(b, 2000);  // 4 blocks, 3 identified
  kv.release(ta);                      // a's 4 cached blocks are the older ones
  EXPECT_EQ(kv.free_blocks(), 1 + 1 + 4);
  EXPECT_EQ(kv.cached_blocks(), 4);
  // 3 blocks: the free one, a's partial one, then one eviction -- a's tail block.
  BlockTable tc;
  ASSERT_TRUE(kv.reserve(tc, 3 * kBt).ok());
  EXPECT_EQ(kv.prefix_counters().evictions, 1u);
  BlockTable probe;
  EXPECT_EQ(kv.match_prefix(probe, a), 3);  // a keeps its head 3 blocks
  kv.release(probe);
  // b is referenced: a reservation beyond free + cached fails and evicts nothing of b.
  EXPECT_EQ(kv.free_blocks(), 3);
  BlockTable td;
  EXPECT_FALSE(kv.reserve(td, 4 * kBt).ok());
  EXPECT_TRUE(td.blocks.empty());
  ASSERT_TRUE(kv.reserve(td, 3 * kBt).ok());  // takes all of a's cached blocks
  EXPECT_EQ(kv.prefix_counters().evictions, 4u);
  EXPECT_EQ(kv.cached_blocks(), 0);
  for (int p = 0; p < 3 * kBt + 1; ++p) EXPECT_EQ(kv.k_row(0, tb, p)[0], 2000.0f + float(p));
  kv.release(tb);
  EXPECT_EQ(kv.match_prefix(probe, b), 3);
  kv.release(probe);
  kv.release(tc);
  kv.release(td);
  EXPECT_EQ(kv.used_blocks(), 0);
}

TEST(PrefixCache, SharedBlocksAreCountedAndSurviveTheirFirstOwner) {
  Pool pool(8);
  KvCache& kv = *pool.kv;
  const auto sys = ids(2 * kBt, 7);
  BlockTable t1 = pool.fill(cat(sys, ids(5, 1)), 100);
  BlockTable t2 = pool.fill(cat(sys, ids(3, 2)), 500);  // shares the 2 system blocks
  ASSERT_EQ(t1.blocks[0], t2.blocks[0]);
  ASSERT_EQ(t1.blocks[1], t2.blocks[1]);
  const std::int32_t shared0 = t2.blocks[0];
  EXPECT_EQ(kv.ref_count(t1.blocks[0]), 2);
  EXPECT_EQ(kv.used_blocks(), 4);
  kv.release(t1);
  EXPECT_EQ(kv.ref_count(t2.blocks[0]), 1);
  EXPECT_EQ(kv.cached_blocks(), 0);  // t1's partial block is free, its shared ones still used
  // Pressure: everything else can be taken, the shared blocks cannot.
  BlockTable big;
  ASSERT_TRUE(kv.reserve(big, std::int64_t(kv.free_blocks()) * kBt).ok());
  EXPECT_EQ(kv.free_blocks(), 0);
  for (std::int32_t b : big.blocks) EXPECT_NE(b, t2.blocks[0]);
  for (int p = 0; p < 2 * kBt; ++p) EXPECT_EQ(kv.k_row(0, t2, p)[0], 100.0f + float(p));
  kv.release(big);
  kv.release(t2);
  EXPECT_EQ(kv.cached_blocks(), 2);
  EXPECT_EQ(kv.ref_count(shared0), 0);
}

TEST(PrefixCache, ResizeDropsOnlyUnreferencedCachedBlocks) {
  Pool pool(12, 16);
  KvCache& kv = *pool.kv;
  const auto a = ids(4 * kBt, 1), b = ids(4 * kBt + 2, 2), c = ids(3 * kBt, 3);
  BlockTable ta = pool.fill(a, 1000);  // blocks 0..3
  BlockTable tb = pool.fill(b, 2000);  // blocks 4..8 (4 identified)
  BlockTable tc = pool.fill(c, 3000);  // blocks 9..11
  kv.release(ta);                      // 4 cached (oldest)
  kv.release(tc);                      // 3 cached, above b
  ASSERT_EQ(kv.cached_blocks(), 7);
  ASSERT_EQ(kv.used_blocks(), 5);
  std::vector<BlockTable*> tables = {&tb};
  EXPECT_FALSE(kv.resize(4, tables).ok());  // below the 5 referenced
  EXPECT_EQ(kv.cached_blocks(), 7);
  // 9 blocks: 5 referenced + 4 cached survive; 3 are dropped, least recently released first (a's,
  // tail first), the rest move below 9 with their rows.
  ASSERT_TRUE(kv.resize(9, tables).ok());
  EXPECT_EQ(kv.num_blocks(), 9);
  EXPECT_EQ(kv.prefix_counters().evictions, 3u);
  EXPECT_EQ(kv.cached_blocks(), 4);
  EXPECT_EQ(kv.used_blocks(), 5);
  for (std::int32_t blk : tb.blocks) EXPECT_LT(blk, 9);
  for (int p = 0; p < 4 * kBt + 2; ++p) EXPECT_EQ(kv.k_row(0, tb, p)[0], 2000.0f + float(p));
  BlockTable probe;
  EXPECT_EQ(kv.match_prefix(probe, cat(c, {1})), 3);  // c moved (from 9..11) and still matches
  for (int p = 0; p < 3 * kBt; ++p) EXPECT_EQ(kv.k_row(0, probe, p)[0], 3000.0f + float(p));
  kv.release(probe);
  EXPECT_EQ(kv.match_prefix(probe, a), 1);  // a kept its head block only
  kv.release(probe);
  kv.release(tb);
  EXPECT_EQ(kv.match_prefix(probe, b), 4);  // b's blocks are cached after their move
  kv.release(probe);
  ASSERT_TRUE(kv.resize(16, tables).ok());
  EXPECT_EQ(kv.free_blocks(), 16);
}

}  // namespace
}  // namespace ferry::serve
