// SPDX-License-Identifier: Apache-2.0
// The NVMe bounce buffer (docs/plan.md, "NVMe staging in host memory"): the stream executor holds
// one pinned staging record in host memory for the whole run once any boundary's home is NVMe, and
// every NVMe store and fetch passes through it. The planner charges it to host memory once. A
// hand-computed three-layer problem where two boundaries must leave the GPU and host memory has
// room for neither in host memory: on NVMe they fit without the buffer and do not with it; the
// solvers, the evaluator, the diagnosis, the text and the JSON all say so. (The MILP == exact
// agreement with the buffer on random instances is in milp_exact_test.cpp.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plan/evaluate.h"
#include "plan/exact.h"
#include "plan/milp.h"
#include "plan/plan_json.h"
#include "plan/report.h"
#include "plan/search.h"
#include "tests/unit/plan/plan_test_util.h"

namespace ferry::plan {
namespace {

using testing::two_boundaries_must_leave_the_gpu;

TEST(NvmeBounce, TheBufferIsTheLargestBoundaryAndOnlyWithAnNvmeTier) {
  PlanProblem p = two_boundaries_must_leave_the_gpu();
  p.boundary_gb = {0.5, 1.25, 0.75, 9.0};  // boundary L never has an NVMe home
  EXPECT_DOUBLE_EQ(nvme_bounce_gb(p), 1.25);
  p.nvme_cap_gb = 0;
  EXPECT_DOUBLE_EQ(nvme_bounce_gb(p), 0.0);
}

// The bounce buffer makes the NVMe plan infeasible at a host budget that fits it without the
// buffer; the smallest host budget that fits is the model state + one buffer.
TEST(NvmeBounce, BounceBufferMakesAnNvmePlanInfeasible) {
  const PlanProblem tight = two_boundaries_must_leave_the_gpu();
  PlanProblem roomy = tight;
  roomy.host_cap_gb = tight.host_fixed_gb + 1.0;  // exactly the state + one bounce buffer

  // At the roomy budget both solvers home boundaries 0 and 1 on NVMe (host homes need 3 GB) and
  // agree; the host memory is the state + one buffer, not one per NVMe boundary.
  auto exact = solve_exact(roomy);
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  auto milp = solve_milp(roomy);
  ASSERT_TRUE(milp.ok()) << milp.status().to_string();
  EXPECT_NEAR(milp->solver.objective_ms, exact->best.solver.objective_ms,
              1e-6 * exact->best.solver.objective_ms);
  for (const Plan* plan : {&exact->best, &*milp}) {
    EXPECT_EQ(plan->homes[0], Home::kNvme);
    EXPECT_EQ(plan->homes[1], Home::kNvme);
    EXPECT_DOUBLE_EQ(plan->predicted.nvme_bounce_gb, 1.0);
    EXPECT_NEAR(plan->predicted.host_peak_gb, 2.0, 1e-12);
    EXPECT_TRUE(check_fits(roomy, plan->predicted).ok());
  }

  // The same plan at 1.5 GB of host memory: it would fit without the buffer (1 GB), and does not
  // with it; the evaluator names host memory and the buffer.
  auto pred = evaluate(tight, *milp);
  ASSERT_TRUE(pred.ok()) << pred.status().to_string();
  EXPECT_LE(pred->host_peak_gb - pred->nvme_bounce_gb, tight.host_cap_gb);
  const Status fits = check_fits(tight, *pred);
  ASSERT_EQ(fits.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(fits.message().find("host memory: needs 2.000 GB (incl. the 1.000 GB nvme bounce "
                                "buffer), capacity 1.500 GB"),
            std::string::npos)
      << fits.to_string();

  // No plan fits: neither solver finds one, and the diagnosis gives the host budget that fits
  // (state + one buffer: 2 GB; without the buffer nothing would be infeasible, with one buffer per
  // NVMe boundary it would say 3 GB) beside the GPU budget of the all-GPU plan (4 GB in t2).
  EXPECT_EQ(solve_exact(tight).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(solve_milp(tight).status().code(), StatusCode::kResourceExhausted);
  auto diag = solve_or_diagnose(tight);
  ASSERT_EQ(diag.status().code(), StatusCode::kResourceExhausted) << diag.status().to_string();
  const std::string msg = diag.status().message();
  EXPECT_NE(msg.find("binding constraint gpu memory (capacity 2.50 GB)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the smallest gpu memory budget that fits is 4.00 GB"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("or host memory >= 2.00 GB"), std::string::npos) << msg;
}

// The text and the JSON show the buffer in the host peak (every window's: the executor holds it
// for the whole run); the JSON round-trips, and a plan written before the key reads 0.
TEST(NvmeBounce, TextAndJsonShowTheBufferInTheHostPeak) {
  PlanProblem p = two_boundaries_must_leave_the_gpu();
  p.host_cap_gb = 2.0;
  auto plan = solve_milp(p);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  const std::string text = plan_text(p, *plan);
  EXPECT_NE(text.find("host 2.00 / 2.00 GB (every window, incl. the 1.00 GB nvme bounce buffer)"),
            std::string::npos)
      << text;

  const Json j = plan_to_json(*plan, &p);
  EXPECT_DOUBLE_EQ(j.at("predicted").at("nvme_bounce_gb").get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j.at("predicted").at("host_peak_gb").get<double>(), 2.0);
  auto back = plan_from_json(j);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, *plan);
  Json old = j;
  old["predicted"].erase("nvme_bounce_gb");
  auto old_plan = plan_from_json(old);
  ASSERT_TRUE(old_plan.ok()) << old_plan.status().to_string();
  EXPECT_EQ(old_plan->predicted.nvme_bounce_gb, 0.0);

  // Without an NVMe home there is no buffer: all on the GPU at a roomy GPU budget.
  PlanProblem gpu = p;
  gpu.gpu_cap_gb = 10;
  auto all_gpu = solve_milp(gpu);
  ASSERT_TRUE(all_gpu.ok()) << all_gpu.status().to_string();
  EXPECT_EQ(all_gpu->predicted.nvme_bounce_gb, 0.0);
  EXPECT_DOUBLE_EQ(all_gpu->predicted.host_peak_gb, gpu.host_fixed_gb);
  EXPECT_NE(plan_text(gpu, *all_gpu).find("(every window)"), std::string::npos);
}

// The buffer's timing (docs/plan.md, "NVMe traffic through the bounce buffer") on the same problem
// at the host budget that fits (state + one buffer), where both solvers home boundaries 0 and 1 on
// NVMe. By hand, no CPU optimizer, no serial part, windows f0 f1 f2 loss b2 b1 b0 (t = 0..6),
// compute 10 10 10 5 20 20 20 = 95 ms:
// - stores: D2H (50 GB/s) then the disk write (4 GB/s), host blocked: 20 + 250 = 270 ms per GB.
//   Boundary 0 (the embedding's output, stored before f0 is issued) and boundary 1 (produced by
//   f0) both count in f0: 540 ms exposed there, no compute hides them; f1, f2 expose nothing (one
//   0.1 GB weight prefetch each, 2 ms).
// - fetches: disk read (5 GB/s) then H2D (50 GB/s), one boundary at a time: 200 + 20 = 220 ms
//   per GB, 440 ms for both, hidden by the compute of the windows they use. Boundary 1 must be
//   back by b2 (t4), boundary 0 by b1 (t5); GPU memory (2.5 GB) lets at most 0.5 GB arrive in the
//   loss window (boundaries 2 and 3 hold 2 GB there) and at most 0.5 GB of boundary 0 by b2, so
//   every one of the three windows gets some, and the fetches expose 440 - (5 + 20 + 20) = 395 ms.
// Step 95 + 540 + 395 = 1030 ms; the move penalty adds 1e-4 ms per GB on 4 GB moved. The test
// pins the evaluator, the MILP and the exact solver to it: without the store term or with the
// fetch priced at the disk's rate alone (beside its H2D, as before), in any of them, it fails.
constexpr double kStepMs = 95 + 540 + 395;
constexpr double kObjectiveMs = kStepMs + 1e-4 * 4;

TEST(NvmeBounce, StoresAreSerialAndFetchesReadThenCopyThroughTheOneBuffer) {
  PlanProblem p = two_boundaries_must_leave_the_gpu();
  p.host_cap_gb = 2.0;
  EXPECT_DOUBLE_EQ(nvme_store_ms_per_gb(p), 270.0);
  EXPECT_DOUBLE_EQ(nvme_fetch_ms_per_gb(p), 220.0);
  EXPECT_EQ(nvme_store_window(p, 0), 0);
  EXPECT_EQ(nvme_store_window(p, 1), 0);
  EXPECT_EQ(nvme_store_window(p, 2), 1);

  // The evaluator, on a schedule written by hand: stores in the window each boundary is read,
  // fetches half and half (boundary 1 in loss and b2, boundary 0 in b2 and b1).
  Plan plan;
  plan.policy = "hand";
  plan.num_layers = 3;
  plan.homes = {Home::kNvme, Home::kNvme, Home::kGpu, Home::kGpu};
  plan.spans = {{0, 1, false}, {1, 2, false}, {2, 3, false}};
  plan.transfers = {{0, 0, false, true, 1.0}, {1, 1, false, true, 1.0}, {1, 3, true, true, 0.5},
                    {1, 4, true, true, 0.5},  {0, 4, true, true, 0.5},  {0, 5, true, true, 0.5}};
  auto r = evaluate(p, plan);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(check_fits(p, *r).ok()) << check_fits(p, *r).to_string();
  const std::vector<double> exposed = {540, 0, 0, 110 - 5, 220 - 20, 110 - 20, 0};
  for (int t = 0; t < 7; ++t) EXPECT_NEAR(r->window_exposed_ms[t], exposed[t], 1e-9) << t;
  EXPECT_NEAR(r->nvme_store_ms, 540, 1e-9);
  EXPECT_NEAR(r->nvme_fetch_ms, 440, 1e-9);
  EXPECT_NEAR(r->step_ms, kStepMs, 1e-9);
  EXPECT_NEAR(r->objective_ms, kObjectiveMs, 1e-9);
  // An NVMe store leaves in the window that reads the boundary, not later (the executor writes it
  // out as soon as it is produced).
  Plan late = plan;
  late.transfers[1].window = 2;
  EXPECT_EQ(evaluate(p, late).status().code(), StatusCode::kInvalidArgument);

  // The MILP and the exact solver price the same homes the same, down to the windows.
  auto exact = solve_exact(p);
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  auto milp = solve_milp(p);
  ASSERT_TRUE(milp.ok()) << milp.status().to_string();
  EXPECT_LE(exact->max_lp_mismatch_ms, 1e-6);
  for (const Plan* q : {&exact->best, &*milp}) {
    EXPECT_EQ(q->homes, plan.homes);
    EXPECT_NEAR(q->solver.objective_ms, kObjectiveMs, 1e-6);
    EXPECT_NEAR(q->predicted.step_ms, kStepMs, 1e-6);
    EXPECT_NEAR(q->predicted.window_exposed_ms[0], 540, 1e-6);
    EXPECT_NEAR(q->predicted.nvme_store_ms, 540, 1e-9);
    EXPECT_NEAR(q->predicted.nvme_fetch_ms, 440, 1e-6);
  }

  // The text names both legs, the JSON carries them and reads back.
  const std::string text = plan_text(p, *milp);
  EXPECT_NE(text.find("nvme traffic through the one bounce buffer: stores 540.0 ms"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("fetches 440.0 ms"), std::string::npos) << text;
  const Json j = plan_to_json(*milp, &p);
  EXPECT_NEAR(j.at("predicted").at("nvme_store_ms").get<double>(), 540, 1e-9);
  auto back = plan_from_json(j);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, *milp);
  Json old = j;
  old["predicted"].erase("nvme_store_ms");
  old["predicted"].erase("nvme_fetch_ms");
  auto old_plan = plan_from_json(old);
  ASSERT_TRUE(old_plan.ok()) << old_plan.status().to_string();
  EXPECT_EQ(old_plan->predicted.nvme_store_ms, 0.0);
}

}  // namespace
}  // namespace ferry::plan
