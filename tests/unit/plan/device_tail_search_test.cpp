// SPDX-License-Identifier: Apache-2.0
// The device optimizer tail as the planner's choice (plan/device_tail.h, `--device-update-layers
// auto`, docs/plan.md): the search (K = 0 and the undominated gates solved, ties priced with the
// best plan) gives the K and the objective of solving every K with the exact solver on random
// small instances, inside the resident search too (the best (R, K) of every pair); a slow device
// with an optimizer that does not bind gives K = 0; a binding optimizer with a fast device a
// tail; staging that does not fit gives K = 0, not a failure; the plan JSON carries K.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "plan/device_tail.h"
#include "plan/evaluate.h"
#include "plan/exact.h"
#include "plan/milp.h"
#include "plan/plan_json.h"
#include "plan/resident.h"
#include "tests/unit/plan/plan_test_util.h"
#include "tests/unit/plan/planners.h"

namespace ferry::plan {
namespace {

using testing::exact_planner;
using testing::milp_planner;

constexpr double kRelTol = 1e-6;
constexpr double kTieMs = 1e-9;

// Tail costs from their own stream: the device's time per layer measured (a constant) or derived
// (0: the layer's share of the host state over the H2D rate, which differs per layer with its
// weights); measured CPU times per layer on some; the CPU optimizer a few forward passes long on
// most (so that the gate binds); the staging 0..0.6 GB (sometimes more than the cap leaves).
void add_tail_costs(std::mt19937_64& rng, PlanProblem& p, int n) {
  double fwd = 0;
  for (const LayerCost& c : p.layers) fwd += c.fwd_ms;
  if (n % 4 != 3) p.cpu_optimizer_ms = fwd * testing::uniform(rng, 1.0, 6.0);
  const double cpu_per_layer = p.cpu_optimizer_ms / p.num_layers;
  if (n % 3 == 1) {
    double layers_ms = 0;
    for (LayerCost& c : p.layers) {
      c.optimizer_ms = cpu_per_layer * testing::uniform(rng, 0.3, 1.0);
      layers_ms += c.optimizer_ms;
    }
    p.cpu_optimizer_ms = layers_ms + testing::uniform(rng, 0.0, 2.0 * cpu_per_layer);  // globals
  }
  if (n % 2 == 0) {
    p.device_update_ms_per_layer = cpu_per_layer * testing::uniform(rng, 0.3, 2.0);
  } else {
    p.device_update_ms_per_layer = 0;
    p.host_fixed_gb = testing::uniform(rng, 0.5, 3.0);
  }
  p.device_update_staging_gb = testing::uniform(rng, 0.0, 0.6);
  // Every fourth: the tail's H2D bytes per layer given (measured) instead of derived from the host
  // state, on the small side, so that the link's share does not rule out every tail.
  if (n % 4 == 0) p.device_update_h2d_gb_per_layer = testing::uniform(rng, 0.005, 0.1);
}

struct Best {
  int r = -1, k = -1;
  double obj = std::numeric_limits<double>::infinity();
};

// Every (R, K) solved exactly; the first of the smallest objective in (R, K) order (the resident
// search's tie rule outside, the tail's inside).
Best exhaustive(const PlanProblem& p, bool resident) {
  Best b;
  const int L = p.num_layers;
  for (int r = 0; r <= (resident ? L : 0); ++r) {
    Best in_r;
    for (int k = 0; k <= L - r; ++k) {
      auto e = solve_exact(at_device_tail(at_resident(p, r), k));
      if (!e.ok()) {
        EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted);
        continue;
      }
      EXPECT_EQ(e->best.device_update_layers, k);
      if (e->best.solver.objective_ms < in_r.obj - kTieMs) {
        in_r = {r, k, e->best.solver.objective_ms};
      }
    }
    if (in_r.obj < b.obj - kTieMs) b = in_r;
  }
  return b;
}

TEST(DeviceTailSearch, EqualsSolvingEveryKWithTheExactSolver) {
  std::mt19937_64 rng(20261206);
  std::mt19937_64 rng_tail(20261207);
  int feasible = 0, tail = 0, partial = 0, zero_by_memory = 0, fewer_solves = 0, multi = 0,
      with_resident = 0;
  for (int n = 0; n < 36; ++n) {
    const int L = 2 + n % 3;  // 2..4 (every (R, K) pair solved exactly: keep the suite quick)
    PlanProblem p = testing::random_problem(rng, L, n % 6 == 0, testing::uniform(rng, 0.0, 0.8));
    if (n % 5 == 2 && L <= 3) testing::add_keep_costs(rng, p, 0.1, 1.0);
    add_tail_costs(rng_tail, p, n);
    // Every third with GPU-resident layers searched around the tail (the tail takes the layers
    // above them: device_tail_layers).
    const bool resident = n % 3 == 0;
    if (resident) {
      for (LayerCost& c : p.layers) c.resident_gb = testing::uniform(rng_tail, 0.05, 0.6);
      p.resident_update_ms_per_layer = testing::uniform(rng_tail, 0.2, 2.0);
    }
    SCOPED_TRACE(::testing::Message()
                 << "instance " << n << " L=" << L << " opt " << p.cpu_optimizer_ms << " dev "
                 << p.device_update_ms_per_layer << " staging " << p.device_update_staging_gb);
    const Best want = exhaustive(p, resident);
    const auto search = [&](const Planner& base) -> Result<Plan> {
      if (resident) return resident_planner(device_tail_planner(base), kResidentAuto)(p);
      return device_tail_planner(base)(p);
    };
    auto s = search(exact_planner());
    if (want.k < 0) {
      EXPECT_FALSE(s.ok()) << "the search found a plan no K admits";
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    ++feasible;
    EXPECT_EQ(s->resident_layers, want.r);
    EXPECT_EQ(s->device_update_layers, want.k);
    EXPECT_NEAR(s->predicted.objective_ms, want.obj, kRelTol * std::max(1.0, want.obj));
    // The plan as returned is what the evaluator prices at its (R, K), and fits.
    const PlanProblem at = at_device_tail(at_resident(p, s->resident_layers), want.k);
    auto pred = evaluate(at, *s);
    ASSERT_TRUE(pred.ok()) << pred.status().to_string();
    EXPECT_TRUE(check_fits(at, *pred).ok());
    EXPECT_NEAR(pred->objective_ms, want.obj, kRelTol * std::max(1.0, want.obj));
    // The MILP in the same search reaches the same optimum.
    auto m = search(milp_planner());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_NEAR(m->predicted.objective_ms, want.obj, kRelTol * std::max(1.0, want.obj));
    if (want.k > 0) ++tail;
    if (want.k > 0 && want.k < L - want.r) ++partial;
    if (resident && want.r > 0) ++with_resident;
    const PlanProblem pr = at_resident(p, want.r);
    if (want.k == 0 && !solve_exact(at_device_tail(pr, L - want.r)).ok() && solve_exact(pr).ok()) {
      ++zero_by_memory;
    }
    auto ts = search_device_tail(pr, exact_planner());
    ASSERT_TRUE(ts.ok());
    if (static_cast<int>(ts->solved.size()) < L - want.r + 1) ++fewer_solves;
    if (ts->solved.size() > 2) ++multi;
  }
  EXPECT_GE(feasible, 24);
  EXPECT_GE(tail, 6);
  EXPECT_GE(partial, 2);
  EXPECT_GE(zero_by_memory, 1);
  EXPECT_GE(fewer_solves, 12);
  EXPECT_GE(with_resident, 2);
  std::printf(
      "tail search: %d feasible, %d with a tail (%d partial), %d zero by memory, %d with resident "
      "layers; %d solved fewer than every K, %d more than two K\n",
      feasible, tail, partial, zero_by_memory, with_resident, fewer_solves, multi);
}

// Four layers of 2 ms forward; the CPU updates in 2 ms per layer (8 ms of a 24+ ms step: the
// forward of layer j needs U_j = 2j ms <= the 2j ms of forward before it, no wait), and the
// device takes 5 ms per layer. Every K predicts the same step (no wait, the phase under the
// step), so the tie goes to K = 0.
TEST(DeviceTailSearch, SlowDeviceAndNoBindingOptimizerGiveZero) {
  std::mt19937_64 rng(3);
  PlanProblem p = testing::random_problem(rng, 4, false, 1.0);
  for (LayerCost& c : p.layers) c.fwd_ms = 2.0;
  p.gpu_cap_gb = 1e3;
  for (LayerCost& c : p.layers) c.optimizer_ms = 2.0;
  p.cpu_optimizer_ms = 8.0;
  p.device_update_ms_per_layer = 5.0;
  p.device_update_staging_gb = 0.1;
  auto s = search_device_tail(p, milp_planner());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->plan.device_update_layers, 0);
  EXPECT_EQ(s->plan.predicted.optimizer_wait_ms, 0.0);
  // The objective is K's alike; the tail buys nothing.
  for (int k = 1; k <= 4; ++k) {
    auto e = evaluate(at_device_tail(p, k), s->plan);
    ASSERT_TRUE(e.ok());
    EXPECT_GE(e->objective_ms, s->plan.predicted.objective_ms - kTieMs) << "K " << k;
  }
}

// A random L-layer problem whose forward waits for the CPU optimizer: 2 ms forwards, 20 ms of
// update per layer (cpu_optimizer_ms = 20 L), and a device at 3 ms per layer.
PlanProblem binding_optimizer_problem(std::uint64_t seed, int L) {
  std::mt19937_64 rng(seed);
  PlanProblem p = testing::random_problem(rng, L, false, 1.0);
  for (LayerCost& c : p.layers) {
    c.fwd_ms = 2.0;
    c.optimizer_ms = 20.0;
  }
  p.cpu_optimizer_ms = 20.0 * L;
  p.device_update_ms_per_layer = 3.0;
  return p;
}

// The CPU optimizer 20 ms per layer against 2 ms forwards: the forward waits for it (K = 0), and
// a device at 3 ms per layer takes the bottom layers off the CPU: the search picks a tail, with
// less wait and a shorter step than K = 0.
TEST(DeviceTailSearch, BindingOptimizerPicksATail) {
  PlanProblem p = binding_optimizer_problem(5, 5);
  p.gpu_cap_gb = 1e3;
  p.device_update_staging_gb = 0.1;
  // The gate alone: the tail moves no bytes in this problem (none given, and no host state to
  // derive them from), so the link is the weight stream's (the tail's share of it:
  // device_tail_link_test.cpp).
  p.host_fixed_gb = 0;
  auto zero = solve_milp(at_device_tail(p, 0));
  ASSERT_TRUE(zero.ok());
  EXPECT_GT(zero->predicted.optimizer_wait_ms, 10.0);
  auto s = search_device_tail(p, milp_planner());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_GT(s->plan.device_update_layers, 1);
  EXPECT_LT(s->plan.predicted.optimizer_wait_ms, zero->predicted.optimizer_wait_ms);
  EXPECT_LT(s->plan.predicted.step_ms, zero->predicted.step_ms - 10.0);
  // A device at least as fast per layer: the gates form a chain, two solves (K = 0 and the
  // meeting point), and no larger K is better.
  EXPECT_EQ(s->solved.size(), 2u);
  for (int k = 0; k <= 5; ++k) {
    auto e = solve_milp(at_device_tail(p, k));
    ASSERT_TRUE(e.ok());
    EXPECT_GE(e->predicted.objective_ms, s->plan.predicted.objective_ms - 1e-6) << "K " << k;
  }
}

// The staging does not fit beside the smallest plan: K = 0, not a failure (while solving at any
// K > 0 alone is refused).
TEST(DeviceTailSearch, StagingThatDoesNotFitGivesZero) {
  PlanProblem p = binding_optimizer_problem(9, 4);
  p.device_update_staging_gb = p.gpu_cap_gb;  // never fits beside gpu_fixed_gb
  auto alone = solve_milp(at_device_tail(p, 2));
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), StatusCode::kResourceExhausted);
  auto s = search_device_tail(p, milp_planner());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->plan.device_update_layers, 0);
  EXPECT_GT(s->plan.predicted.optimizer_wait_ms, 0.0);  // the tail would have paid
  // With room for it the same problem takes a tail.
  p.device_update_staging_gb = 0.01;
  auto room = search_device_tail(p, milp_planner());
  ASSERT_TRUE(room.ok());
  EXPECT_GT(room->plan.device_update_layers, 0);
}

TEST(DeviceTailSearch, PlanJsonCarriesK) {
  std::mt19937_64 rng(11);
  PlanProblem p = testing::random_problem(rng, 4, false, 1.0);
  p.gpu_cap_gb = 1e3;
  for (LayerCost& c : p.layers) c.optimizer_ms = 20.0;
  p.cpu_optimizer_ms = 80.0;
  p.device_update_ms_per_layer = 3.0;
  p.device_update_staging_gb = 0.25;
  auto s = search_device_tail(p, milp_planner());
  ASSERT_TRUE(s.ok());
  const int k = s->plan.device_update_layers;
  ASSERT_GT(k, 0);
  const PlanProblem at = at_device_tail(p, k);
  const Json j = plan_to_json(s->plan, &at);
  EXPECT_EQ(j.at("device_update_layers").get<int>(), k);
  EXPECT_EQ(j.at("problem").at("device_update_layers").get<int>(), k);
  EXPECT_EQ(j.at("problem").at("device_update_staging_gb").get<double>(), 0.25);
  auto back = plan_from_json(j);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, s->plan);
  auto prob = plan_problem_from_json(j);
  ASSERT_TRUE(prob.ok() && prob->has_value());
  EXPECT_EQ((*prob)->device_update_layers, k);
  EXPECT_EQ((*prob)->device_update_staging_gb, 0.25);
  // An older document without the top-level key: the tail its problem was solved with.
  Json old = j;
  old.erase("device_update_layers");
  auto old_plan = plan_from_json(old);
  ASSERT_TRUE(old_plan.ok());
  EXPECT_EQ(old_plan->device_update_layers, k);
  old["problem"].erase("device_update_layers");
  old["problem"].erase("device_update_ms_per_layer");
  auto older = plan_from_json(old);
  ASSERT_TRUE(older.ok());
  EXPECT_EQ(older->device_update_layers, 0);
  // A K beyond the non-resident layers is refused.
  Json bad = j;
  bad["device_update_layers"] = 5;
  EXPECT_FALSE(plan_from_json(bad).ok());
  // A problem without a tail serializes as before (no keys).
  PlanProblem none = at_device_tail(p, 0);
  none.device_update_ms_per_layer = 0;
  none.device_update_staging_gb = 0;
  EXPECT_FALSE(to_json(none).contains("device_update_layers"));
  EXPECT_FALSE(to_json(none).contains("device_update_staging_gb"));
}

// The staging counts in every window at K > 0 only, and not when resident layers leave the tail
// nothing.
TEST(DeviceTailSearch, StagingIsGpuMemoryOnlyWithATail) {
  std::mt19937_64 rng(13);
  PlanProblem p = testing::random_problem(rng, 3, false, 1.0);
  p.gpu_cap_gb = 1e3;
  p.device_update_staging_gb = 0.5;
  auto plan = solve_milp(at_device_tail(p, 0));
  ASSERT_TRUE(plan.ok());
  for (int k = 0; k <= 3; ++k) {
    auto e = evaluate(at_device_tail(p, k), *plan);
    ASSERT_TRUE(e.ok());
    EXPECT_NEAR(e->gpu_peak_gb - plan->predicted.gpu_peak_gb, k > 0 ? 0.5 : 0.0, 1e-12);
  }
  for (LayerCost& c : p.layers) c.resident_gb = 0;
  const PlanProblem all_resident = at_device_tail(at_resident(p, 3), 3);
  EXPECT_EQ(device_tail_layers(all_resident), 0);
  EXPECT_EQ(device_tail_gpu_gb(all_resident), 0.0);
  EXPECT_EQ(device_tail_layers(at_device_tail(at_resident(p, 1), 3)), 2);
}

}  // namespace
}  // namespace ferry::plan
