// SPDX-License-Identifier: Apache-2.0
// The CPU optimizer in the planner's objective (docs/plan.md, "the optimizer gate"), on problems
// small enough to price by hand: the evaluator's wait per forward window, the solvers (MILP and
// exact) choosing a different plan when the optimizer's time grows, and the batch search choosing
// a different batch. Every expected number is derived in the comments from the costs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "plan/evaluate.h"
#include "plan/exact.h"
#include "plan/milp.h"
#include "plan/search.h"
#include "tests/unit/plan/plan_test_util.h"

namespace ferry::plan {
namespace {

// Three layers: boundaries 1 and 2 of 1 GB, 0 and 3 empty; forward 2 ms, backward 8 ms, recompute
// 2 ms per layer, loss 3 ms (all compute: 3*2 + 3 + 3*8 = 33 ms). Weights of 1 MB per layer (their
// prefetch takes 0.01 ms, hidden everywhere) and equal, so the optimizer splits its time in thirds:
// U_1 = opt/3, U_2 = 2*opt/3. 100 GB/s per direction (1 GB = 10 ms), 200 duplex. The loss window
// needs 1 GB of work memory and the GPU holds 2.5 GB, so boundaries 1 and 2 cannot both stay on the
// GPU through the loss window (1 + 1 + 1 = 3 GB); spans of at most 2 (one recomputed layer).
PlanProblem three_layers(double optimizer_ms) {
  PlanProblem p;
  p.num_layers = 3;
  p.boundary_gb = {0, 1, 1, 0};
  const LayerCost c{.fwd_ms = 2, .bwd_ms = 8, .rec_ms = 2, .weight_gb = 0.001};
  p.layers = {c, c, c};
  p.loss_ms = 3;
  p.loss_work_gb = 1;
  p.cpu_optimizer_ms = optimizer_ms;
  p.link = LinkRates{100, 100, 200, 200, 0, 0};
  p.gpu_cap_gb = 2.5;
  p.host_cap_gb = 100;
  p.max_span = 2;
  p.batch_size = 1;
  p.seq_len = 1;
  p.model_flops_per_step = 1e12;
  p.source = "hand";
  return p;
}

// Boundary 1 on the host, 1 GB out in f1, back by b2 (its deadline: before b1): 0.25 GB in the
// loss window (2.5 ms + the 0.01-ms prefetch within its 3 ms) and 0.75 GB in b2 (7.5 + 0.01 within
// 8 ms), so nothing is exposed on the way back.
Plan host_plan() {
  Plan plan;
  plan.num_layers = 3;
  plan.homes = {Home::kGpu, Home::kHost, Home::kGpu, Home::kGpu};
  plan.spans = {{0, 1, false}, {1, 2, false}, {2, 3, false}};
  plan.transfers = {
      {1, 1, false, false, 1.0}, {1, 3, true, false, 0.25}, {1, 4, true, false, 0.75}};
  return plan;
}

TEST(OptimizerGate, EvaluatorHoldsEachForwardWindowForItsLayer) {
  // opt = 30: U = (0, 10, 20). The host plan's f1 moves 1 GB out (10 ms) behind 2 ms of compute:
  // 8 ms exposed, f1 lasts 10 ms. f0 runs 0..2; f1 waits for U_1 = 10 (held 8), runs 10..20; f2
  // starts at max(20, U_2 = 20) (held 0) and ends at 22. Wait 8, exposed 8: gpu step 33 + 8 = 41,
  // step 41 + 8 = 49 (above the optimizer's 30: bound 0).
  const PlanProblem p = three_layers(30);
  auto r = evaluate(p, host_plan());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_NEAR(r->window_exposed_ms[1], 8, 1e-9);
  EXPECT_NEAR(r->exposed_ms, 8, 1e-9);
  ASSERT_EQ(r->window_optimizer_wait_ms.size(), 7u);
  EXPECT_NEAR(r->window_optimizer_wait_ms[0], 0, 1e-9);
  EXPECT_NEAR(r->window_optimizer_wait_ms[1], 8, 1e-9);
  EXPECT_NEAR(r->window_optimizer_wait_ms[2], 0, 1e-9);
  EXPECT_NEAR(r->optimizer_wait_ms, 8, 1e-9);
  EXPECT_NEAR(r->gpu_step_ms, 41, 1e-9);
  EXPECT_NEAR(r->step_ms, 49, 1e-9);
  EXPECT_NEAR(r->optimizer_bound_ms, 0, 1e-9);
  EXPECT_NEAR(r->idle_ms(), 16, 1e-9);
  // opt = 60 (U = 0, 20, 40): f1 held 18 (runs 20..30), f2 held 10 (40..42): wait 28, step 69.
  // opt = 100 (U = 0, 33.33, 66.67): f1 held 31.33 (33.33..43.33), f2 held 23.33 (66.67..68.67):
  // wait 164/3 = 54.67, gpu + wait 95.67 < 100: step 100, bound 4.33.
  auto r60 = evaluate(three_layers(60), host_plan());
  ASSERT_TRUE(r60.ok());
  EXPECT_NEAR(r60->optimizer_wait_ms, 28, 1e-9);
  EXPECT_NEAR(r60->step_ms, 69, 1e-9);
  auto r100 = evaluate(three_layers(100), host_plan());
  ASSERT_TRUE(r100.ok());
  EXPECT_NEAR(r100->optimizer_wait_ms, 164.0 / 3, 1e-9);
  EXPECT_NEAR(r100->step_ms, 100, 1e-9);
  EXPECT_NEAR(r100->optimizer_bound_ms, 100 - 41 - 164.0 / 3, 1e-9);
  // The objective is the step plus the move penalty on the 2 GB moved.
  EXPECT_NEAR(r100->objective_ms, 100 + 2 * p.move_penalty_ms_per_gb, 1e-9);
}

TEST(OptimizerGate, MeasuredPerLayerTimesReplaceTheWeightSplit) {
  // Per-layer update times 5, 1, 25 ms (a profile's optimizer_layer_ms): U = (0, 1, 26) instead
  // of the weight split's (0, 10, 20). The host plan's f1 (10 ms with its exposed transfer) starts
  // at 2, not held; f2 waits from 12 to 26 (held 14): wait 14, step 33 + 8 + 14 = 55.
  PlanProblem p = three_layers(30);
  p.layers[0].optimizer_ms = 5;
  p.layers[1].optimizer_ms = 1;
  p.layers[2].optimizer_ms = 25;
  const std::vector<double> ready = optimizer_ready_ms(p);
  ASSERT_EQ(ready.size(), 3u);
  EXPECT_NEAR(ready[1], 1, 1e-12);
  EXPECT_NEAR(ready[2], 26, 1e-12);
  auto r = evaluate(p, host_plan());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_NEAR(r->window_optimizer_wait_ms[1], 0, 1e-9);
  EXPECT_NEAR(r->window_optimizer_wait_ms[2], 14, 1e-9);
  EXPECT_NEAR(r->step_ms, 55, 1e-9);
  // A layer without a measured time: the split of the total for every layer.
  p.layers[1].optimizer_ms = 0;
  EXPECT_NEAR(optimizer_ready_ms(p)[2], 20, 1e-12);
  // The measured times survive the problem's JSON.
  p.layers[1].optimizer_ms = 1;
  auto back = problem_from_json(to_json(p));
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->layers[2].optimizer_ms, 25);
  EXPECT_EQ(optimizer_ready_ms(*back), ready);
}

// The choice this problem leaves (all on the GPU does not fit the loss window):
//   recompute layer 0 (path 0->2) or layer 1 (path 0->1->3): +2 ms of compute in a backward
//     window, no transfer;
//   boundary 1 on the host: 1 GB out within f1..f2 (4 ms of compute for 10 ms of transfer: >= 6 ms
//     exposed), back within loss..b2 (11 ms of compute: hidden if at most 0.5 GB lands in the loss
//     window, where memory allows 0.5 GB);
//   boundary 2 on the host: 1 GB out in f2 alone (2 ms for 10: 8 ms exposed).
// Without an optimizer: recompute, step 33 + 2 = 35, against >= 39 for the host.
// With opt = 30 (U = 0, 10, 20): the forward ends at max_k (U_k + sum_{m>=k} w_m).
//   recompute: w = (2, 2, 2) -> max(6, 14, 22) = 22, wait 16, step 35 + 16 = 51;
//   boundary 1 on the host, x GB out in f1 and 1 - x in f2: f2 hides 2 ms (0.2 GB) of it, more
//     is exposed after the last gate; f1 lasts 2 + max(0, 10x - 2) and ends by 10 + 10x <= 20 =
//     U_2. For x in [0.8, 1] the forward ends at U_2 + 2 = 22, so the exposed ms of f1 sit inside
//     the wait for U_2: exposed + wait = 22 - 6 = 16, step 33 + 16 = 49, the optimum (no plan ends
//     the forward before 22 or has less compute than 33: 49 = 33 - 6 + 22).
TEST(OptimizerGate, SolversTradeRecomputeForOffloadHiddenBehindTheOptimizer) {
  for (double opt : {0.0, 30.0}) {
    SCOPED_TRACE(::testing::Message() << "cpu optimizer " << opt << " ms");
    const PlanProblem p = three_layers(opt);
    auto milp = solve_milp(p, SolveOptions{.seed_with_fixed_policies = false});
    ASSERT_TRUE(milp.ok()) << milp.status().to_string();
    auto exact = solve_exact(p);
    ASSERT_TRUE(exact.ok()) << exact.status().to_string();
    EXPECT_NEAR(milp->solver.objective_ms, exact->best.solver.objective_ms, 1e-6);
    for (const Plan* plan : {&*milp, &exact->best}) {
      const Prediction& r = plan->predicted;
      EXPECT_NEAR(r.objective_ms, plan->solver.objective_ms, 1e-6);
      if (opt == 0) {
        EXPECT_NEAR(r.step_ms, 35, 1e-6);
        EXPECT_NEAR(r.recompute_ms, 2, 1e-6);
        EXPECT_TRUE(plan->transfers.empty());
      } else {
        EXPECT_NEAR(r.step_ms, 49, 1e-6);
        EXPECT_NEAR(r.idle_ms(), 16, 1e-6);
        EXPECT_GE(r.optimizer_wait_ms, 8 - 1e-6);
        EXPECT_NEAR(r.recompute_ms, 0, 1e-9);
        EXPECT_EQ(plan->homes[1], Home::kHost);
        EXPECT_EQ(plan->homes[2], Home::kGpu);
        double out_f1 = 0;
        for (const Transfer& x : plan->transfers) {
          if (!x.to_gpu && x.window == 1) out_f1 += x.gb;
        }
        EXPECT_GE(out_f1, 0.8 - 1e-6) << "boundary 1 leaves in f1, behind the optimizer";
      }
    }
  }
  // The optimizer-blind plan (recompute) costs 51 under the optimizer: 2 ms worse than the optimum.
  auto blind = solve_milp(three_layers(0));
  ASSERT_TRUE(blind.ok());
  auto priced = evaluate(three_layers(30), *blind);
  ASSERT_TRUE(priced.ok());
  EXPECT_NEAR(priced->step_ms, 51, 1e-6);
}

// Random instances shaped like three_layers (L = 3..5, sizes and times drawn around it): the GPU
// cannot keep every boundary through the loss window, so each plan trades one-layer recomputes
// against offloads whose transfers fall in the forward windows, where a long enough optimizer
// update hides them. MILP and exact must agree with the optimizer term in the objective, and in
// some instances the plan chosen without it (priced with it) must be strictly worse.
PlanProblem gate_sensitive(std::mt19937_64& rng, int L) {
  using testing::uniform;
  PlanProblem p;
  p.num_layers = L;
  p.boundary_gb.assign(L + 1, 0);
  double interior = 0, largest = 0, fwd = 0;
  for (int i = 1; i < L; ++i) {
    p.boundary_gb[i] = uniform(rng, 0.6, 1.2);
    interior += p.boundary_gb[i];
    largest = std::max(largest, p.boundary_gb[i]);
  }
  for (int j = 0; j < L; ++j) {
    LayerCost c;
    c.fwd_ms = uniform(rng, 1.5, 3.0);
    c.bwd_ms = c.fwd_ms * uniform(rng, 3.0, 4.5);
    c.rec_ms = c.fwd_ms * uniform(rng, 0.9, 1.1);
    c.weight_gb = 0.001 * uniform(rng, 0.5, 1.5);
    p.layers.push_back(c);
    fwd += c.fwd_ms;
  }
  p.loss_ms = uniform(rng, 2, 4);
  p.loss_work_gb = uniform(rng, 0.8, 1.2);
  p.link = LinkRates{uniform(rng, 60, 140), uniform(rng, 60, 140), 0, 0, 0, 0};
  p.link.duplex_gbps = p.link.h2d_gbps + p.link.d2h_gbps;
  p.link.duplex_loaded_gbps = p.link.duplex_gbps;
  // Room for two neighbouring boundaries (every forward window holds one in, one out) but not for
  // all of them through the loss window.
  p.gpu_cap_gb =
      std::max(2 * largest, p.loss_work_gb + interior - uniform(rng, 0.3, 0.9) * largest);
  p.host_cap_gb = 100;
  p.max_span = 2;
  p.cpu_optimizer_ms = fwd * uniform(rng, 1.0, 5.0);
  p.batch_size = 1;
  p.seq_len = 1;
  p.model_flops_per_step = 1e12;
  p.source = "random";
  return p;
}

TEST(OptimizerGate, RandomGateSensitiveInstancesMilpEqualsExact) {
  std::mt19937_64 rng(20261130);
  int feasible = 0, changed = 0;
  for (int n = 0; n < 30; ++n) {
    const int L = 3 + n % 3;
    const PlanProblem p = gate_sensitive(rng, L);
    SCOPED_TRACE(::testing::Message()
                 << "instance " << n << " L=" << L << " optimizer " << p.cpu_optimizer_ms << " ms");
    auto exact = solve_exact(p);
    auto milp = solve_milp(p, SolveOptions{.seed_with_fixed_policies = false});
    if (!exact.ok()) {
      EXPECT_FALSE(milp.ok());
      continue;
    }
    ASSERT_TRUE(milp.ok()) << milp.status().to_string();
    ++feasible;
    const double want = exact->best.solver.objective_ms;
    EXPECT_NEAR(milp->solver.objective_ms, want, 1e-6 * want);
    EXPECT_NEAR(milp->predicted.objective_ms, milp->solver.objective_ms, 1e-6 * want);
    EXPECT_LE(exact->max_lp_mismatch_ms, 1e-6 * want);
    PlanProblem blind = p;
    blind.cpu_optimizer_ms = 0;
    auto blind_plan = solve_exact(blind);
    ASSERT_TRUE(blind_plan.ok());
    auto priced = evaluate(p, blind_plan->best);
    ASSERT_TRUE(priced.ok());
    EXPECT_GE(priced->objective_ms, want - 1e-6 * want);
    if (priced->objective_ms > want + 1e-3) ++changed;
  }
  EXPECT_GE(feasible, 20);
  EXPECT_GE(changed, 5);
  std::printf("gate-sensitive: %d feasible, the optimizer term changed the plan in %d\n", feasible,
              changed);
}

// The batch search on a problem linear in the batch b: boundaries 1 and 2 of b/4 GB; forward b ms,
// backward 4b, loss 2b (compute 17b), serial 5 ms; loss work b/4 GB; a 2.6 GB GPU; no recompute
// (spans of 1); 100 GB/s per direction, weights as above.
//   Fits: f1 always holds boundaries 1 and 2 (b/2 GB): b <= 5. All on the GPU also holds both in
//   the loss window with its work (3b/4 GB): b <= 3. At b = 4, 5 boundary 1 goes to the host (out
//   within f1..f2: 2b ms of compute for 2.5b ms of transfer, 0.5b exposed; back hidden in loss +
//   b2, 6b ms; boundary 2 instead would expose 1.5b).
// Without an optimizer the steps are 17b + 5 (+ 0.5b at 4, 5): b = 5: 92.5 ms, 2.5 exposed (2.7 %
//   of the step, over the 2 % limit); b = 4: 75 ms, 2 exposed (2.67 %); b = 3: all on the GPU, no
//   idle -> the search walks down from 5 to 3 and picks 3.
// With a 200 ms optimizer (U_1 = 66.67, U_2 = 133.33): the forward ends at U_2 + b at the earliest
//   and f1's exposure fits inside the wait, so the step is 5 + 133.33 + b + 2b + 12b, floored at
//   200: b = 5: 213.33 ms (5 / 213.33 = 0.0234 samples/ms), b = 4: 198.33 -> 200 (0.020), b = 2,
//   1: 200 (0.010, 0.005). The optimizer alone idles the GPU far past 2 % at b = 5 (wait 115.8
//   ms), so no smaller batch can do better on idle and the search keeps the fastest batch tried,
//   5, with boundary 1 on the host.
PlanProblem linear_in_batch(int b, double optimizer_ms) {
  PlanProblem p;
  p.num_layers = 3;
  p.boundary_gb = {0, 0.25 * b, 0.25 * b, 0};
  const LayerCost c{.fwd_ms = 1.0 * b, .bwd_ms = 4.0 * b, .rec_ms = 1.0 * b, .weight_gb = 0.001};
  p.layers = {c, c, c};
  p.loss_ms = 2.0 * b;
  p.loss_work_gb = 0.25 * b;
  p.step_fixed_ms = 5;
  p.cpu_optimizer_ms = optimizer_ms;
  p.link = LinkRates{100, 100, 200, 200, 0, 0};
  p.gpu_cap_gb = 2.6;
  p.host_cap_gb = 100;
  p.max_span = 1;
  p.batch_size = b;
  p.seq_len = 1;
  p.model_flops_per_step = 1e12 * b;
  p.source = "hand";
  return p;
}

TEST(OptimizerGate, BatchSearchPicksALargerBatchWhenTheOptimizerDominates) {
  const Planner solve = [](const PlanProblem& p) { return solve_milp(p); };
  const BatchSearchOptions o{.max_batch = 64};

  auto none =
      largest_batch([](int b) -> Result<PlanProblem> { return linear_in_batch(b, 0); }, solve, o);
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->largest_fitting, 5);
  EXPECT_EQ(none->batch, 3);
  EXPECT_TRUE(none->exposure_ok);
  EXPECT_NEAR(none->plan.predicted.step_ms, 56, 1e-6);
  EXPECT_EQ(none->plan.homes, (std::vector<Home>{Home::kGpu, Home::kGpu, Home::kGpu, Home::kGpu}));

  auto heavy =
      largest_batch([](int b) -> Result<PlanProblem> { return linear_in_batch(b, 200); }, solve, o);
  ASSERT_TRUE(heavy.ok()) << heavy.status().to_string();
  EXPECT_EQ(heavy->largest_fitting, 5);
  EXPECT_EQ(heavy->batch, 5);
  EXPECT_FALSE(heavy->exposure_ok);
  EXPECT_NEAR(heavy->plan.predicted.step_ms, 5 + 400.0 / 3 + 15 * 5, 1e-6);
  EXPECT_EQ(heavy->plan.homes[1], Home::kHost);
  // At batch 4 the optimizer floors the step at 200 ms: the search's fallback compared throughput.
  auto at4 = solve_milp(linear_in_batch(4, 200));
  ASSERT_TRUE(at4.ok());
  EXPECT_NEAR(at4->predicted.step_ms, 200, 1e-6);
  EXPECT_GT(at4->predicted.optimizer_bound_ms, 0);
}

}  // namespace
}  // namespace ferry::plan
