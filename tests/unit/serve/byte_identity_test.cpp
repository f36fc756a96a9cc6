// SPDX-License-Identifier: Apache-2.0
// Byte identity (serve.md item 5): the same token ids and the same logits bits in every expert
// mode, every eviction policy and every pager cap from top-k up to all experts, through chunked
// prefill and decode, with 3 concurrent requests (two greedy, one sampled with a seed), for the
// Qwen3-MoE, Mixtral and OLMoE fixtures. The resident engine is the reference; the tight caps make
// the pager split prefill chunks into token groups and evict inside a step.
// CPU-computed experts (cpu-experts) are bit-identical here because the CPU is the only compute
// in this build; on a GPU build that path would be compared against a tolerance instead.
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

using testing::run_engine;
using testing::RunRecord;
using testing::same_bits;

struct Variant {
  ExpertMode mode;
  EvictionPolicy policy = EvictionPolicy::kLru;
  int cap = 0;
  bool hot = false;
  bool uneven = false;  // per-layer caps alternate between top-k and cap
  std::string name() const {
    return fmt::format("{}/{}/cap{}{}{}", to_string(mode), to_string(policy), cap,
                       hot ? "/hot" : "", uneven ? "/uneven" : "");
  }
};

std::vector<GenerationRequest> requests(int vocab) { return testing::mixed_requests(vocab); }

Result<RunRecord> run_variant(const model::LoadedModel& m, const Variant& v) {
  EngineConfig cfg;
  cfg.pager.mode = v.mode;
  cfg.pager.policy = v.policy;
  cfg.pager.slots_per_layer = v.cap;
  if (v.uneven) {
    cfg.pager.layer_slots.assign(m.geometry.layers, 0);
    for (int l = 0; l < m.geometry.layers; ++l) {
      cfg.pager.layer_slots[l] = l % 2 == 0 ? m.geometry.top_k : v.cap;
    }
  }
  if (v.hot) {
    cfg.pager.hot_experts.assign(m.geometry.layers, {});
    for (int l = 0; l < m.geometry.layers; ++l) {
      if (m.geometry.layer_is_moe[l]) cfg.pager.hot_experts[l] = {l % m.geometry.experts};
    }
  }
  cfg.max_batch_tokens = 8;  // prompts arrive in chunks, mixed with other requests' decodes
  cfg.max_running = 3;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  FERRY_ASSIGN_OR_RETURN(auto eng, Engine::create(m.geometry, m.params, cfg));
  return run_engine(*eng, requests(m.geometry.vocab));
}

class ByteIdentity : public ::testing::TestWithParam<const char*> {};

TEST_P(ByteIdentity, EveryModePolicyAndCapGivesTheSameBits) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  auto ref = run_variant(m, {ExpertMode::kResident});
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  ASSERT_EQ(ref->tokens.size(), 3u);

  std::vector<Variant> variants = {{ExpertMode::kStatic}, {ExpertMode::kCpuExperts}};
  for (EvictionPolicy p : {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kLfru}) {
    for (int cap = m.geometry.top_k; cap <= m.geometry.experts; ++cap) {
      variants.push_back({ExpertMode::kPaged, p, cap});
    }
    variants.push_back({ExpertMode::kPaged, p, m.geometry.top_k + 1, /*hot=*/true});
    variants.push_back({ExpertMode::kPaged, p, m.geometry.experts, false, /*uneven=*/true});
  }
  int compared_rows = 0;
  for (const Variant& v : variants) {
    auto got = run_variant(m, v);
    ASSERT_TRUE(got.ok()) << v.name() << ": " << got.status().to_string();
    EXPECT_EQ(got->tokens, ref->tokens) << GetParam() << " " << v.name();
    for (const auto& [id, rows] : ref->logits) {
      const auto& g = got->logits.at(id);
      ASSERT_EQ(g.size(), rows.size()) << v.name();
      for (std::size_t i = 0; i < rows.size(); ++i) {
        EXPECT_TRUE(same_bits(g[i], rows[i]))
            << GetParam() << " " << v.name() << " request " << id << " row " << i;
        ++compared_rows;
      }
    }
  }
  EXPECT_GT(compared_rows, 0);
}

// Paged at top-k slots per layer with three streams of up to 8 batched tokens: steps that need
// more experts than the slots hold.
Result<std::unique_ptr<Engine>> tight_paged_engine(const model::LoadedModel& m) {
  EngineConfig cfg;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.pager.slots_per_layer = m.geometry.top_k;
  cfg.max_batch_tokens = 8;
  cfg.max_running = 3;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  return Engine::create(m.geometry, m.params, cfg);
}

// The pager actually worked in the tight cases (the identity above is not vacuous).
TEST_P(ByteIdentity, TightCapsMissEvictAndSplit) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  auto eng = tight_paged_engine(m);
  ASSERT_TRUE(eng.ok()) << eng.status().to_string();
  ExpertPager& pager = *(*eng)->experts().pager();
  int over_budget = 0, events = 0;
  pager.set_observer([&](const SlotEvent&) {
    over_budget += pager.resident_bytes() > pager.budget().bytes_limit();
    ++events;
  });
  ASSERT_TRUE(run_engine(**eng, requests(m.geometry.vocab)).ok());
  EXPECT_EQ(over_budget, 0);
  EXPECT_GT(events, 0);
  EXPECT_LE(pager.budget().bytes_peak(), pager.budget().bytes_limit());
  const PagerCounters& c = pager.counters();
  EXPECT_GT(c.misses, 0u);
  EXPECT_GT(c.evictions, 0u);
  std::uint64_t moe_layers = 0;
  for (bool b : m.geometry.layer_is_moe) moe_layers += b;
  // Without splitting, every MoE layer of every step is exactly one group.
  EXPECT_GT((*eng)->experts().counters().groups, (*eng)->stats().steps * moe_layers)
      << "no step was split into token groups";
}

// A step whose experts do not fit the slots is split by experts: every routed expert is copied at
// most once per layer step (token groups re-copied an expert for each later group that routed to
// it after its eviction), and the tight cap does split (several groups per layer step).
TEST_P(ByteIdentity, SplitStepsCopyEachMissedExpertOncePerLayerStep) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  auto eng = tight_paged_engine(m);
  ASSERT_TRUE(eng.ok()) << eng.status().to_string();
  std::uint64_t distinct_per_layer_step = 0, layer_steps = 0;
  (*eng)->experts().set_access_observer([&](int, std::span<const std::int32_t> ids) {
    std::set<std::int32_t> d(ids.begin(), ids.end());
    distinct_per_layer_step += d.size();
    ++layer_steps;
  });
  ASSERT_TRUE(run_engine(**eng, requests(m.geometry.vocab)).ok());
  const PagerCounters& c = (*eng)->experts().pager()->counters();
  EXPECT_GT(c.misses, 0u);
  EXPECT_LE(c.misses, distinct_per_layer_step);
  EXPECT_GT((*eng)->experts().counters().groups, layer_steps) << "no step was split";
}

// What each mode moves: static copies every MoE layer's E experts once per step, paged copies
// exactly its misses, resident and cpu-experts copy nothing and hold no device bytes.
TEST_P(ByteIdentity, EachModeCopiesWhatItShould) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  std::uint64_t moe_layers = 0;
  for (bool b : m.geometry.layer_is_moe) moe_layers += b;
  for (ExpertMode mode :
       {ExpertMode::kResident, ExpertMode::kStatic, ExpertMode::kCpuExperts, ExpertMode::kPaged}) {
    EngineConfig cfg;
    cfg.pager.mode = mode;
    cfg.pager.slots_per_layer = m.geometry.top_k;
    cfg.max_batch_tokens = 8;
    cfg.max_running = 3;
    cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
    auto eng = Engine::create(m.geometry, m.params, cfg);
    ASSERT_TRUE(eng.ok());
    ASSERT_TRUE(run_engine(**eng, requests(m.geometry.vocab)).ok());
    const ExpertExecutor& ex = (*eng)->experts();
    const std::uint64_t steps = (*eng)->stats().steps;
    const std::size_t eb = ex.store() ? ex.store()->expert_bytes() : 0;
    switch (mode) {
      case ExpertMode::kStatic:
        EXPECT_EQ(ex.counters().static_bytes_copied,
                  steps * moe_layers * std::uint64_t(m.geometry.experts) * eb);
        EXPECT_EQ(ex.device_bytes(), std::size_t(m.geometry.experts) * eb);
        break;
      case ExpertMode::kPaged:
        EXPECT_EQ(ex.pager()->counters().bytes_copied, ex.pager()->counters().misses * eb);
        EXPECT_EQ(ex.device_bytes(), moe_layers * m.geometry.top_k * eb);
        EXPECT_EQ(ex.counters().static_bytes_copied, 0u);
        break;
      default:
        EXPECT_EQ(ex.device_bytes(), 0u) << to_string(mode);
        EXPECT_EQ(ex.counters().static_bytes_copied, 0u) << to_string(mode);
        EXPECT_EQ(ex.pager(), nullptr);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MoeFixtures, ByteIdentity,
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe"),
                         [](const auto& pi) { return std::string(pi.param); });

}  // namespace
}  // namespace ferry::serve
