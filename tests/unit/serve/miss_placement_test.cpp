// SPDX-License-Identifier: Apache-2.0
// Per-miss placement in paged mode (PagerConfig: miss_cost_model, bypass_window): misses computed
// from the host store instead of copied keep every output bit (tokens and logits equal the
// resident reference on the MoE fixtures), and the decisions follow their rules — the cost model
// sends every miss to the host when the link is slow and none when it is fast; bypass admission
// computes one-offs from the host only when admitting would evict, and copies less.
#include <gtest/gtest.h>

#include "serve/engine.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

using testing::run_engine;
using testing::same_bits;

std::vector<GenerationRequest> requests(int vocab) { return testing::mixed_requests(vocab); }

struct Run {
  testing::RunRecord record;
  ExecutorCounters executor;
  PagerCounters pager;
};

Result<Run> run(const model::LoadedModel& m, ExpertMode mode, const PagerConfig& placement) {
  EngineConfig cfg;
  cfg.pager = placement;
  cfg.pager.mode = mode;
  cfg.pager.slots_per_layer = mode == ExpertMode::kPaged ? m.geometry.top_k + 1 : 0;
  cfg.max_batch_tokens = 8;
  cfg.max_running = 3;
  cfg.kv = {.block_tokens = 4, .budget_bytes = 1 << 20};
  FERRY_ASSIGN_OR_RETURN(auto eng, Engine::create(m.geometry, m.params, cfg));
  Run r;
  FERRY_ASSIGN_OR_RETURN(r.record, run_engine(*eng, requests(m.geometry.vocab)));
  r.executor = eng->experts().counters();
  if (eng->experts().pager() != nullptr) r.pager = eng->experts().pager()->counters();
  return r;
}

void expect_same(const Run& got, const Run& ref, const std::string& what) {
  EXPECT_EQ(got.record.tokens, ref.record.tokens) << what;
  for (const auto& [id, rows] : ref.record.logits) {
    const auto& g = got.record.logits.at(id);
    ASSERT_EQ(g.size(), rows.size()) << what;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      EXPECT_TRUE(same_bits(g[i], rows[i])) << what << " request " << id << " row " << i;
    }
  }
}

class MissPlacement : public ::testing::TestWithParam<const char*> {};

TEST_P(MissPlacement, HostComputedMissesKeepTheBitsAndFollowTheirRules) {
  const testing::Fixture f = testing::load_fixture(GetParam());
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  auto ref = run(m, ExpertMode::kResident, {});
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  auto copy_all = run(m, ExpertMode::kPaged, {});
  ASSERT_TRUE(copy_all.ok()) << copy_all.status().to_string();
  ASSERT_GT(copy_all->pager.misses, 0u);
  EXPECT_EQ(copy_all->executor.cpu_misses + copy_all->executor.bypassed, 0u);

  // A slow link and a fast CPU: every miss is cheaper on the host; nothing is copied.
  PagerConfig slow_link{.miss_cost_model = true, .link_gbps = 1e-6, .cpu_gflops = 1e6};
  auto host = run(m, ExpertMode::kPaged, slow_link);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  expect_same(*host, *ref, "cost model, slow link");
  EXPECT_GT(host->executor.cpu_misses, 0u);
  EXPECT_EQ(host->pager.misses, 0u);
  EXPECT_EQ(host->pager.bytes_copied, 0u);

  // A fast link and a slow CPU: the cost model copies every miss, as the default does.
  PagerConfig fast_link{.miss_cost_model = true, .link_gbps = 1e6, .cpu_gflops = 1e-6};
  auto copied = run(m, ExpertMode::kPaged, fast_link);
  ASSERT_TRUE(copied.ok()) << copied.status().to_string();
  expect_same(*copied, *ref, "cost model, fast link");
  EXPECT_EQ(copied->executor.cpu_misses, 0u);
  EXPECT_EQ(copied->pager.misses, copy_all->pager.misses);

  // Bypass admission: misses that would evict and were not used in the last step run from the
  // host; fewer bytes cross the link, the bits stay.
  PagerConfig bypass{.bypass_window = 1};
  auto byp = run(m, ExpertMode::kPaged, bypass);
  ASSERT_TRUE(byp.ok()) << byp.status().to_string();
  expect_same(*byp, *ref, "bypass admission");
  EXPECT_GT(byp->executor.bypassed, 0u);
  EXPECT_LT(byp->pager.bytes_copied, copy_all->pager.bytes_copied);
  EXPECT_LT(byp->pager.evictions, copy_all->pager.evictions);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MissPlacement,
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe"));

TEST(MissPlacement, BadRatesAreRefused) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  for (PagerConfig bad : {PagerConfig{.link_gbps = 0}, PagerConfig{.cpu_gflops = -1},
                          PagerConfig{.bypass_window = -2}}) {
    auto r = run(*f.model, ExpertMode::kPaged, bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
  }
}

// --cpu-gflops auto: the executor measures the host path's kernel (on the CPU engine
// expert_ffn_row, kExact) and the cost model uses that rate; without the cost model nothing is
// measured and the configured rate stays.
TEST(MissPlacement, MeasuredCpuRateIsWhatTheCostModelUses) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const model::LoadedModel& m = *f.model;
  EngineConfig cfg;
  cfg.pager.mode = ExpertMode::kPaged;
  cfg.pager.slots_per_layer = m.geometry.top_k + 1;
  cfg.pager.miss_cost_model = true;
  cfg.pager.measure_cpu_gflops = true;
  cfg.pager.cpu_gflops = 12345;  // replaced by the measurement
  auto eng = Engine::create(m.geometry, m.params, cfg);
  ASSERT_TRUE(eng.ok()) << eng.status().to_string();
  const ExpertExecutor& ex = (*eng)->experts();
  ASSERT_TRUE(ex.measured_cpu_rate().has_value());
  const CpuExpertRate& r = *ex.measured_cpu_rate();
  EXPECT_EQ(r.kernel, CpuExpertKernel::kExact);
  EXPECT_GT(r.gflops, 0);
  EXPECT_EQ(ex.placement_cpu_gflops(), r.gflops);
  cfg.pager.miss_cost_model = false;  // bypass only: no cost model, nothing to measure
  cfg.pager.bypass_window = 1;
  auto plain = Engine::create(m.geometry, m.params, cfg);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_FALSE((*plain)->experts().measured_cpu_rate().has_value());
  EXPECT_EQ((*plain)->experts().placement_cpu_gflops(), 12345);
}

}  // namespace
}  // namespace ferry::serve
