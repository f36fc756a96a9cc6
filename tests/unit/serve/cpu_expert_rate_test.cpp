// SPDX-License-Identifier: Apache-2.0
// measure_cpu_expert_rate (serve/cpu_expert_rate.h, `--cpu-gflops auto`): which experts it
// times (distinct ones up to target_bytes, cycled up to min_calls), that its two figures are the
// same timing (gflops = 6*C*F / seconds per expert, expert_gbps = expert bytes / seconds per
// expert), for both kernels and both store dtypes, and that bad arguments are refused. The rate
// itself is this machine's and is not asserted beyond being positive and finite.
#include <cmath>

#include <gtest/gtest.h>

#include "core/thread_pool.h"
#include "serve/cpu_expert_rate.h"
#include "serve/expert_store.h"
#include "serve_test_util.h"

namespace ferry::serve {
namespace {

TEST(CpuExpertRate, TimesDistinctExpertsAndReportsOneTimingTwoWays) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  const model::DecoderGeometry& geo = f.model->geometry;
  auto store = ExpertStore::create(geo, f.model->params);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  const ExpertStore& s = **store;
  const std::size_t eb = s.expert_bytes();
  const int all = s.moe_layers() * s.experts();
  const double flops = 6.0 * double(s.hidden()) * double(s.width());
  struct Case {
    std::size_t target_bytes;
    int min_calls;
    int want_experts, want_calls;
  };
  const std::vector<Case> cases = {
      {1, 5, 1, 5},                              // one expert, cycled to the minimum
      {3 * eb, 2, 3, 3},                         // three distinct experts, min_calls below them
      {eb * std::size_t(all) * 4, 1, all, all},  // more than the store: every expert once
  };
  for (CpuExpertKernel k : {CpuExpertKernel::kFast, CpuExpertKernel::kExact}) {
    for (const Case& c : cases) {
      auto r = measure_cpu_expert_rate(s, k, ThreadPool::global(), c.target_bytes, c.min_calls, 2);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_EQ(r->kernel, k);
      EXPECT_EQ(r->experts, c.want_experts);
      EXPECT_EQ(r->calls, c.want_calls);
      EXPECT_EQ(r->passes, 2);
      EXPECT_EQ(r->bytes_per_pass, std::size_t(c.want_calls) * eb);
      ASSERT_TRUE(std::isfinite(r->seconds_per_expert) && r->seconds_per_expert > 0);
      EXPECT_DOUBLE_EQ(r->gflops, flops / r->seconds_per_expert / 1e9);
      EXPECT_DOUBLE_EQ(r->expert_gbps, double(eb) / r->seconds_per_expert / 1e9);
    }
  }
}

TEST(CpuExpertRate, Bf16StoreIsTimedToo) {
  const testing::Fixture f = testing::load_fixture("mixtral");
  ASSERT_TRUE(f.model);
  auto store = ExpertStore::create(f.model->geometry, f.model->params, DType::kBF16);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto r = measure_cpu_expert_rate(**store, CpuExpertKernel::kFast, ThreadPool::global());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GT(r->gflops, 0);
  EXPECT_DOUBLE_EQ(r->expert_gbps * 1e9 * r->seconds_per_expert, double((*store)->expert_bytes()));
}

TEST(CpuExpertRate, BadArgumentsAreRefused) {
  const testing::Fixture f = testing::load_fixture("qwen3_moe");
  ASSERT_TRUE(f.model);
  auto store = ExpertStore::create(f.model->geometry, f.model->params);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  ThreadPool& pool = ThreadPool::global();
  for (auto r : {measure_cpu_expert_rate(**store, CpuExpertKernel::kDefault, pool),
                 measure_cpu_expert_rate(**store, CpuExpertKernel::kFast, pool, 0),
                 measure_cpu_expert_rate(**store, CpuExpertKernel::kFast, pool, 1, 0),
                 measure_cpu_expert_rate(**store, CpuExpertKernel::kFast, pool, 1, 1, 0)}) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
  }
}

}  // namespace
}  // namespace ferry::serve
