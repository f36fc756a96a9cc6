// SPDX-License-Identifier: Apache-2.0
// The KV cache in bf16 (KvConfig::dtype, `--kv-dtype bf16`):
//   - a block is half the bytes of an f32 block, so a budget holds twice the blocks;
//   - write_rows rounds each element to nearest even (core/dtype.h f32_to_bf16), f32 copies;
//   - paged attention over bf16 rows gives, bit for bit, its result over an f32 cache holding the
//     same rounded rows (the widening is exact and the arithmetic is the f32 path's), for
//     grouped-query heads, several sequences, scattered block tables, prefill and decode shapes;
//   - a resize that moves blocks moves their bf16 rows intact;
//   - the engine with a bf16 cache: every expert mode, policy and cap gives the resident bf16
//     engine's token ids and logits bits (byte identity holds within a KV dtype), on the
//     Qwen3-MoE, Mixtral and OLMoE fixtures, with the prefix cache on; its logits differ from the
//     f32 cache's (the rounding is really there) by an amount printed, not asserted.
#include <cmath>
#include <cstring>

#include "serve/kv_cache.h"
#include "serve/paged_attention.h"
#include "serve/sampler.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

TEST(KvDtype, Bf16BlocksAreHalfTheBytesSoABudgetHoldsTwiceAsMany) {
  const std::size_t budget = 1 << 20;
  auto f32 = KvCache::create(testing::kv_geometry(3, 4, 2, 16),
                             {.block_tokens = 8, .budget_bytes = budget});
  auto bf16 = KvCache::create(testing::kv_geometry(3, 4, 2, 16),
                              {.block_tokens = 8, .budget_bytes = budget, .dtype = DType::kBF16});
  ASSERT_TRUE(f32.ok() && bf16.ok());
  EXPECT_EQ((*f32)->block_bytes(), std::size_t(3 * 2 * 8 * 2 * 16 * 4));
  EXPECT_EQ((*bf16)->block_bytes() * 2, (*f32)->block_bytes());
  EXPECT_EQ((*bf16)->num_blocks(), int(budget / (*bf16)->block_bytes()));
  EXPECT_GE((*bf16)->num_blocks(), 2 * (*f32)->num_blocks());  // floor(2B / x) >= 2 floor(B / x)
  EXPECT_EQ((*bf16)->row_bytes(), std::size_t(2 * 16 * 2));
  auto bad = KvCache::create(testing::kv_geometry(3, 4, 2, 16),
                             {.block_tokens = 8, .budget_bytes = budget, .dtype = DType::kF16});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(parse_kv_dtype("fp8").ok());
  EXPECT_EQ(*parse_kv_dtype("bf16"), DType::kBF16);
}

TEST(KvDtype, WriteRowsRoundsToNearestEvenAndF32Copies) {
  const int G = 2, D = 8;
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    auto kv = KvCache::create(testing::kv_geometry(2, 4, G, D),
                              {.block_tokens = 4, .budget_bytes = 1 << 16, .dtype = dt});
    ASSERT_TRUE(kv.ok());
    BlockTable t;
    ASSERT_TRUE((*kv)->reserve(t, 7).ok());
    Rng rng(5);
    std::vector<float> k(G * D), v(G * D);
    for (float& x : k) x = float(rng.uniform() * 8 - 4);
    for (float& x : v) x = float(rng.uniform() * 8 - 4);
    k[0] = 1.0f + 0x1p-8f;  // a tie between two bf16 values: rounds to the even one, 1.0
    k[1] = 1.0f + 0x3p-8f;  // the other tie: rounds up to 1 + 2^-6
    (*kv)->write_rows(1, t, 5, k.data(), v.data());
    const std::byte* kr = (*kv)->k_bytes(1, t, 5);
    const std::byte* vr = (*kv)->v_bytes(1, t, 5);
    if (dt == DType::kF32) {
      EXPECT_EQ(std::memcmp(kr, k.data(), k.size() * 4), 0);
      EXPECT_EQ(std::memcmp(vr, v.data(), v.size() * 4), 0);
      continue;
    }
    const auto* kb = reinterpret_cast<const std::uint16_t*>(kr);
    const auto* vb = reinterpret_cast<const std::uint16_t*>(vr);
    for (int i = 0; i < G * D; ++i) {
      EXPECT_EQ(kb[i], f32_to_bf16(k[i])) << i;
      EXPECT_EQ(vb[i], f32_to_bf16(v[i])) << i;
      EXPECT_LE(std::fabs(bf16_to_f32(kb[i]) - k[i]), std::fabs(k[i]) * 0x1p-8f) << i;
    }
    EXPECT_EQ(bf16_to_f32(kb[0]), 1.0f);
    EXPECT_EQ(bf16_to_f32(kb[1]), 1.0f + 0x1p-6f);
  }
}

// The exact twin: an f32 cache holding the bf16-rounded rows.
TEST(KvDtype, PagedAttentionOnBf16RowsIsTheF32PathOnTheRoundedRows) {
  const int H = 8, G = 2, D = 16, L = 2;
  Rng rng(23);
  for (const int bt : {1, 4, 16}) {
    auto bf = KvCache::create(testing::kv_geometry(L, H, G, D),
                              {.block_tokens = bt, .budget_bytes = 1 << 20, .dtype = DType::kBF16});
    auto f32 = KvCache::create(testing::kv_geometry(L, H, G, D),
                               {.block_tokens = bt, .budget_bytes = 1 << 20});
    ASSERT_TRUE(bf.ok() && f32.ok());
    // Three sequences of different lengths, block tables interleaved (scattered ids).
    const std::vector<int> lens = {1, 9, 23};
    std::vector<BlockTable> tb(3), tf(3);
    for (int p = 0; p < 23; p += bt) {
      for (int s = 0; s < 3; ++s) {
        const std::int64_t upto = std::min(p + bt, lens[std::size_t(s)]);
        if (p >= lens[std::size_t(s)]) continue;
        ASSERT_TRUE((*bf)->reserve(tb[std::size_t(s)], upto).ok());
        ASSERT_TRUE((*f32)->reserve(tf[std::size_t(s)], upto).ok());
      }
    }
    std::vector<float> k(G * D), v(G * D), kr(G * D), vr(G * D);
    for (int l = 0; l < L; ++l) {
      for (int s = 0; s < 3; ++s) {
        for (int p = 0; p < lens[std::size_t(s)]; ++p) {
          for (int i = 0; i < G * D; ++i) {
            k[std::size_t(i)] = float(rng.uniform() * 6 - 3);
            v[std::size_t(i)] = float(rng.uniform() * 6 - 3);
            kr[std::size_t(i)] = bf16_to_f32(f32_to_bf16(k[std::size_t(i)]));
            vr[std::size_t(i)] = bf16_to_f32(f32_to_bf16(v[std::size_t(i)]));
          }
          (*bf)->write_rows(l, tb[std::size_t(s)], p, k.data(), v.data());
          (*f32)->write_rows(l, tf[std::size_t(s)], p, kr.data(), vr.data());
        }
      }
    }
    // A step of every position of every sequence (prefill), then only the last ones (decode).
    for (const bool decode : {false, true}) {
      std::vector<std::int32_t> seq_of, pos;
      for (int s = 0; s < 3; ++s) {
        for (int p = decode ? lens[std::size_t(s)] - 1 : 0; p < lens[std::size_t(s)]; ++p) {
          seq_of.push_back(s);
          pos.push_back(p);
        }
      }
      const std::int64_t T = std::int64_t(pos.size());
      std::vector<float> q(std::size_t(T * H * D));
      for (float& x : q) x = float(rng.uniform() * 2 - 1);
      for (int l = 0; l < L; ++l) {
        std::vector<float> got(q.size()), want(q.size());
        const BlockTable* tbs[] = {&tb[0], &tb[1], &tb[2]};
        const BlockTable* tfs[] = {&tf[0], &tf[1], &tf[2]};
        PagedAttentionArgs a{.out = got.data(),
                             .q = q.data(),
                             .seq_of = seq_of.data(),
                             .pos = pos.data(),
                             .tables = tbs,
                             .T = T,
                             .layer = l,
                             .H = H,
                             .G = G,
                             .D = D,
                             .scale = 1.0f / std::sqrt(float(D))};
        ASSERT_TRUE(paged_attention(**bf, a).ok());
        a.out = want.data();
        a.tables = tfs;
        ASSERT_TRUE(paged_attention(**f32, a).ok());
        EXPECT_TRUE(testing::same_bits(got, want))
            << "block tokens " << bt << " layer " << l << (decode ? " decode" : " prefill");
      }
    }
  }
}

TEST(KvDtype, ResizeMovesBf16RowsIntact) {
  const int L = 2, G = 1, D = 4, bt = 2;
  auto kv = KvCache::create(
      testing::kv_geometry(L, 2, G, D),
      {.block_tokens = bt, .budget_bytes = 4096, .max_budget_bytes = 8192, .dtype = DType::kBF16});
  ASSERT_TRUE(kv.ok()) << kv.status().to_string();
  KvCache& c = **kv;
  ASSERT_GE(c.num_blocks(), 8);
  // Fill the low blocks with a throwaway table, then a kept one above them; freeing the first and
  // shrinking moves the kept table's blocks down.
  BlockTable low, keep;
  ASSERT_TRUE(c.reserve(low, 4 * bt).ok());
  ASSERT_TRUE(c.reserve(keep, 3 * bt).ok());
  auto value = [](int l, int p, int i) { return float(l * 100 + p * 10 + i) + 0.25f; };
  std::vector<float> k(G * D), v(G * D);
  for (int l = 0; l < L; ++l) {
    for (int p = 0; p < 3 * bt; ++p) {
      for (int i = 0; i < G * D; ++i) {
        k[std::size_t(i)] = value(l, p, i);
        v[std::size_t(i)] = -value(l, p, i);
      }
      c.write_rows(l, keep, p, k.data(), v.data());
    }
  }
  c.release(low);
  BlockTable* tables[] = {&keep};
  ASSERT_TRUE(c.resize(4, tables).ok());
  EXPECT_GT(c.blocks_moved(), 0u);
  for (std::int32_t b : keep.blocks) EXPECT_LT(b, 4);
  for (int l = 0; l < L; ++l) {
    for (int p = 0; p < 3 * bt; ++p) {
      const auto* kb = reinterpret_cast<const std::uint16_t*>(c.k_bytes(l, keep, p));
      const auto* vb = reinterpret_cast<const std::uint16_t*>(c.v_bytes(l, keep, p));
      for (int i = 0; i < G * D; ++i) {
        ASSERT_EQ(kb[i], f32_to_bf16(value(l, p, i))) << l << " " << p << " " << i;
        ASSERT_EQ(vb[i], f32_to_bf16(-value(l, p, i))) << l << " " << p << " " << i;
      }
    }
  }
}

Result<testing::RunRecord> run_with_kv(const model::LoadedModel& m, ExpertMode mode, int cap,
                                       EvictionPolicy policy, DType kv_dtype) {
  EngineConfig cfg;
  cfg.pager.mode = mode;
  cfg.pager.policy = policy;
  cfg.pager.slots_per_layer = cap;
  cfg.max_batch_tokens = 8;
  cfg.max_running = 3;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20, .prefix_cache = true, .dtype = kv_dtype};
  FERRY_ASSIGN_OR_RETURN(auto eng, Engine::create(m.geometry, m.params, cfg));
  std::vector<GenerationRequest> reqs = testing::mixed_requests(m.geometry.vocab);
  // A fourth request sharing the first one's prompt: its blocks come from the prefix cache.
  reqs.push_back(reqs[0]);
  return testing::run_engine(*eng, reqs);
}

class KvDtypeEngine : public ::testing::TestWithParam<const char*> {};

TEST_P(KvDtypeEngine, EveryModeGivesTheResidentBitsWithABf16Cache) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  const int K = m.geometry.top_k, E = m.geometry.experts;
  auto ref = run_with_kv(m, ExpertMode::kResident, 0, EvictionPolicy::kLru, DType::kBF16);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  struct V {
    ExpertMode mode;
    int cap;
    EvictionPolicy policy;
  };
  const std::vector<V> variants = {{ExpertMode::kStatic, 0, EvictionPolicy::kLru},
                                   {ExpertMode::kCpuExperts, 0, EvictionPolicy::kLru},
                                   {ExpertMode::kPaged, K, EvictionPolicy::kLru},
                                   {ExpertMode::kPaged, K + 1, EvictionPolicy::kLfu},
                                   {ExpertMode::kPaged, std::max(K, E / 2), EvictionPolicy::kLfru}};
  for (const V& v : variants) {
    auto got = run_with_kv(m, v.mode, v.cap, v.policy, DType::kBF16);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    testing::expect_same_bits(*got, *ref,
                              fmt::format("{} {} cap {} {} bf16 kv", GetParam(), to_string(v.mode),
                                          v.cap, to_string(v.policy)));
  }
  // Against the f32 cache: the rounding shows (the flag reaches the rows); how much, printed.
  auto f32 = run_with_kv(m, ExpertMode::kResident, 0, EvictionPolicy::kLru, DType::kF32);
  ASSERT_TRUE(f32.ok());
  float max_diff = 0, max_abs = 0;
  int same_tokens = 0, tokens = 0;
  for (const auto& [id, rows] : f32->logits) {
    // Rows are comparable while the generated tokens agree (row r follows token r - 1).
    const auto& b = ref->logits.at(id);
    const auto& ta = f32->tokens.at(id);
    const auto& tb = ref->tokens.at(id);
    for (std::size_t r = 0; r < std::min(rows.size(), b.size()); ++r) {
      for (std::size_t i = 0; i < rows[r].size(); ++i) {
        ASSERT_TRUE(std::isfinite(b[r][i]));
        max_diff = std::max(max_diff, std::fabs(rows[r][i] - b[r][i]));
        max_abs = std::max(max_abs, std::fabs(rows[r][i]));
      }
      if (r >= ta.size() || r >= tb.size() || ta[r] != tb[r]) break;
    }
    for (std::size_t i = 0; i < std::min(ta.size(), tb.size()); ++i) {
      ++tokens;
      if (ta[i] != tb[i]) break;
      ++same_tokens;
    }
  }
  EXPECT_GT(max_diff, 0.0f) << "a bf16 cache gave the f32 cache's logits bits";
  std::printf(
      "[kv_dtype] %s: bf16 vs f32 kv, max |d logit| %.3g (max |logit| %.3g), %d of %d "
      "leading tokens equal\n",
      GetParam(), double(max_diff), double(max_abs), same_tokens, tokens);
}

INSTANTIATE_TEST_SUITE_P(MoeFixtures, KvDtypeEngine,
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe"),
                         [](const auto& pi) { return std::string(pi.param); });

}  // namespace
}  // namespace ferry::serve
