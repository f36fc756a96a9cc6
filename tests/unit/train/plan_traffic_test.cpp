// SPDX-License-Identifier: Apache-2.0
// The plan traffic report (src/train/stream/plan_traffic.h; issue #7, "the executor performs
// exactly the transfers and recomputations the plan says (counted)"):
//   - the expectation follows the policy alone (hand-counted bytes and passes of a mix with every
//     home and a kept layer; NVMe records sized for the largest micro-batch);
//   - the streaming executor, following a ferry-plan document with host, NVMe and recomputed
//     boundaries and a kept layer (dense and MoE, 2 steps x accumulation 2 of packed batches of
//     varying length), matches it counter for counter in every step, the same as the trainer
//     accumulates it;
//   - an executor that runs another policy than the plan is flagged (text, JSON, diff), so the
//     comparison can fail; measured_between's recompute count.
#include "train/stream/plan_traffic.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/backend.h"
#include "test_util.h"
#include "train/stream/plan_policy.h"
#include "train/stream/stream_executor.h"
#include "train_stream_util.h"

namespace ferry::train::stream {
namespace {

// An L-layer ferry-plan document (L >= 3): boundary 0 in host memory, 1 recomputed, 2 on NVMe,
// the rest on the GPU; the top layer keeps its internals.
std::string plan_doc(int L) {
  std::string homes, keep;
  for (int i = 0; i <= L; ++i) {
    const char* h = i == 0 ? "host" : i == 1 ? "recompute" : i == 2 ? "nvme" : "gpu";
    homes += fmt::format(R"({}{{"boundary": {}, "home": "{}"}})", i ? ", " : "", i, h);
  }
  for (int l = 0; l < L; ++l) keep += fmt::format("{}{}", l ? ", " : "", l == L - 1 ? 1 : 0);
  return fmt::format(R"({{"format": "ferry-plan", "version": 1, "policy": "solved",
    "num_layers": {}, "batch_size": 3, "seq_len": 24, "boundaries": [{}],
    "keep_internals": [{}]}})",
                     L, homes, keep);
}

// `run` executes 2 steps x accumulation 2 on `m`, counting each step as the trainer does against
// what `plan` says.
PlanTrafficReport run_counted(const model::LoadedModel& m, const ActivationPolicy& run,
                              const ActivationPolicy& plan) {
  const RunSpec spec{.steps = 2, .accum = 2};
  const std::vector<Batch> data = make_batches(spec.steps * spec.accum, m.geometry.vocab, 23);
  std::unique_ptr<TrainState> state = make_state(m, spec);
  auto ex = StreamExecutor::create(*state, kBatch, kSeq, {.policy = run}, kernels::cpu_backend());
  EXPECT_TRUE(ex.ok()) << ex.status().to_string();
  PlanTrafficReport r = make_plan_traffic_report(plan);
  if (!ex.ok()) return r;
  std::size_t next = 0;
  for (int step = 1; step <= spec.steps; ++step) {
    const TrafficCounts before = traffic_counters((*ex)->stats());
    TrafficCounts expected;
    std::int64_t tokens = 0;
    (*ex)->begin_step(spec.accum);
    for (int a = 0; a < spec.accum; ++a) {
      const model::PackedBatch b = data[next++].view();
      tokens += b.ids.numel();
      expected += expected_micro_batch(plan, m.geometry.hidden, b.ids.numel(), kBatch * kSeq);
      EXPECT_TRUE((*ex)->micro_batch(b).ok());
    }
    EXPECT_TRUE((*ex)->finish_step(adamw(), lr_of(step), step).ok());
    add_step(
        r, step, spec.accum, tokens, expected,
        measured_between(before, traffic_counters((*ex)->stats()), m.geometry.layers, spec.accum));
  }
  (*ex)->wait_optimizer();
  return r;
}

TEST(PlanTraffic, ExpectationFollowsThePolicy) {
  auto p = parse_policy("mix:hrnd:" + testing::temp_dir("plan_traffic_nv") + "+keep:3", 4);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  // C = 32, 50 tokens: 6400 bytes a boundary; records of 72 tokens: 9216 -> 12288 bytes.
  const TrafficCounts c = expected_micro_batch(*p, 32, 50, 72);
  EXPECT_EQ(c.act_d2h_bytes, 2u * 6400);  // boundaries 0 (host) and 2 (nvme)
  EXPECT_EQ(c.act_h2d_bytes, 2u * 6400);
  EXPECT_EQ(c.nvme_write_bytes, 12288u);
  EXPECT_EQ(c.nvme_read_bytes, 12288u);
  EXPECT_EQ(c.recompute_forwards, 1u);  // layer 0 regenerates boundary 1
  EXPECT_EQ(c.kept_layers, 1u);
  EXPECT_EQ(c.internals_forwards, 3u);
  EXPECT_EQ(c.layer_forwards, 4u + 1 + 3);
  // Everything on the device: no traffic, L forwards and L re-forwards.
  auto d = parse_policy("device", 4);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(expected_micro_batch(*d, 32, 50, 72),
            (TrafficCounts{.layer_forwards = 8, .internals_forwards = 4}));
}

TEST(PlanTraffic, ExecutorFollowingAPlanDocumentMatchesItEveryStep) {
  const std::string dir = testing::temp_dir("plan_traffic_dense");
  auto dense = dense_model(dir + "/model");
  auto moe = moe_model();
  for (const model::LoadedModel* m : {dense.get(), moe.get()}) {
    auto pp = plan_policy_from_text(plan_doc(m->geometry.layers), "plan", m->geometry.layers,
                                    testing::temp_dir("plan_traffic_nvme"));
    ASSERT_TRUE(pp.ok()) << pp.status().to_string();
    const PlanTrafficReport r = run_counted(*m, pp->policy, pp->policy);
    EXPECT_TRUE(r.match()) << format_plan_traffic(r);
    EXPECT_EQ(r.steps, 2);
    EXPECT_EQ(r.micro_batches, 4);
    EXPECT_EQ(r.expected, r.measured);
    // Every kind of boundary was exercised.
    EXPECT_EQ(r.host, 1);
    EXPECT_EQ(r.nvme, 1);
    EXPECT_EQ(r.recompute, 1);
    EXPECT_EQ(r.kept, 1);
    EXPECT_GT(r.measured.nvme_write_bytes, 0u);
    EXPECT_GT(r.measured.act_h2d_bytes, 0u);
    EXPECT_EQ(r.measured.recompute_forwards, 4u);
    EXPECT_EQ(r.measured.kept_layers, 4u);
    const std::string text = format_plan_traffic(r);
    EXPECT_NE(text.find("plan traffic: match (every counter of all 2 steps)"), std::string::npos)
        << text;
    EXPECT_EQ(text.find("MISMATCH"), std::string::npos) << text;
    const Json j = plan_traffic_json(r);
    EXPECT_EQ(j.at("type"), "plan_traffic");
    EXPECT_TRUE(j.at("match").get<bool>());
    EXPECT_EQ(j.at("expected"), j.at("measured"));
    EXPECT_EQ(j.at("measured").at("act_d2h_bytes").get<std::uint64_t>(), r.measured.act_d2h_bytes);
    EXPECT_FALSE(j.contains("first_mismatch"));
  }
}

TEST(PlanTraffic, AnExecutorOffThePlanIsFlagged) {
  const std::string dir = testing::temp_dir("plan_traffic_off");
  auto m = dense_model(dir + "/model");
  auto pp = plan_policy_from_text(plan_doc(m->geometry.layers), "plan", m->geometry.layers,
                                  testing::temp_dir("plan_traffic_off_nvme"));
  ASSERT_TRUE(pp.ok()) << pp.status().to_string();
  // Boundary 2 in host memory instead of on NVMe: the same boundary bytes, no NVMe records.
  ActivationPolicy off = pp->policy;
  off.homes[2] = Home::kHost;
  const PlanTrafficReport r = run_counted(*m, off, pp->policy);
  EXPECT_FALSE(r.match());
  EXPECT_EQ(r.mismatched_steps, 2);
  EXPECT_EQ(r.mismatched_step_ids, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(r.first_mismatch_step, 1);
  EXPECT_EQ(r.measured.act_d2h_bytes, r.expected.act_d2h_bytes);
  EXPECT_EQ(r.measured.nvme_write_bytes, 0u);
  const std::string diff = traffic_diff(r.first_mismatch_expected, r.first_mismatch_measured);
  EXPECT_NE(diff.find("nvme_write_bytes"), std::string::npos) << diff;
  EXPECT_NE(diff.find("nvme_read_bytes"), std::string::npos) << diff;
  EXPECT_EQ(diff.find("act_d2h_bytes"), std::string::npos) << diff;
  const std::string text = format_plan_traffic(r);
  EXPECT_NE(text.find("plan traffic: MISMATCH in 2 of 2 steps; first step 1: nvme_write_bytes"),
            std::string::npos)
      << text;
  const Json j = plan_traffic_json(r);
  EXPECT_FALSE(j.at("match").get<bool>());
  EXPECT_EQ(j.at("first_mismatch").at("step").get<std::int64_t>(), 1);
  // A plan that recomputes nothing, run with every:2: recomputes the plan does not say.
  auto all_host = parse_policy("host", m->geometry.layers);
  auto every2 = parse_policy("every:2", m->geometry.layers);
  ASSERT_TRUE(all_host.ok() && every2.ok());
  const PlanTrafficReport rr = run_counted(*m, *every2, *all_host);
  EXPECT_FALSE(rr.match());
  EXPECT_EQ(rr.expected.recompute_forwards, 0u);
  EXPECT_EQ(rr.measured.recompute_forwards, 8u);  // 2 per micro-batch (layers 0 and 2)
}

TEST(PlanTraffic, MeasuredBetweenCountsRecomputesOverWholeMicroBatches) {
  const TrafficCounts before{.act_d2h_bytes = 100, .layer_forwards = 10, .internals_forwards = 4};
  // Two micro-batches of a 4-layer model: 8 forward passes, 6 re-forwards, 2 kept, 3 recomputes.
  const TrafficCounts after{.act_d2h_bytes = 700,
                            .act_h2d_bytes = 600,
                            .layer_forwards = 10 + 8 + 6 + 3,
                            .internals_forwards = 4 + 6,
                            .kept_layers = 2};
  const TrafficCounts d = measured_between(before, after, 4, 2);
  EXPECT_EQ(d.act_d2h_bytes, 600u);
  EXPECT_EQ(d.act_h2d_bytes, 600u);
  EXPECT_EQ(d.layer_forwards, 17u);
  EXPECT_EQ(d.internals_forwards, 6u);
  EXPECT_EQ(d.recompute_forwards, 3u);
  EXPECT_EQ(d.kept_layers, 2u);
  EXPECT_EQ(traffic_diff(d, d), "");
}

}  // namespace
}  // namespace ferry::train::stream
