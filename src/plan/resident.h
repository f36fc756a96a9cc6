// SPDX-License-Identifier: Apache-2.0
// The search over GPU-resident layers (PlanProblem::resident_layers, docs/plan.md "resident
// layers"). Residency is a prefix 0..K-1 (as the executor implements it: ResidentLayers), so K is
// one integer; every solver prices a problem at a fixed K, and this outer loop picks K by solving
// at several K and keeping the smallest predicted objective (step + move penalty; ties: the
// smaller K).
//
// Which K are tried: resident bytes are GPU memory in every window and nothing else, so a plan
// that fits at K fits at K-1: feasibility is monotone and the loop stops at the first K where
// nothing fits. With L <= kResidentExhaustiveLayers every K in 0..L is tried (exact: the tests
// hold it to the exact solver, tests/unit/plan/resident_test.cpp). Deeper models: K = 0, s, 2s, ...
// (s = ceil(L / 8)), then every K within s - 1 of the best coarse one (a search, not a proof:
// each probe is a full solve, and 37 of them per batch probe are too slow at 36 layers).
#pragma once

#include <vector>

#include "core/result.h"
#include "plan/plan.h"
#include "plan/problem.h"
#include "plan/search.h"

namespace ferry::plan {

inline constexpr int kResidentExhaustiveLayers = 12;
inline constexpr int kResidentAuto = -1;

// p with resident_layers = k (clamped to [0, L]).
PlanProblem at_resident(const PlanProblem& p, int k);

struct ResidentSearch {
  Plan plan;                         // the best plan; plan.resident_layers is its K
  std::vector<int> tried;            // the K solved, in order
  std::vector<double> objective_ms;  // [tried] each K's objective (infinity: nothing fits)
};

// forced >= 0: only K = min(forced, L). kResidentAuto: the search above. A failure at K = 0 (or
// at the forced K) is returned as it is (the solver's own message: the binding constraint and the
// smallest budget); at K > 0 "does not fit" (resource_exhausted, deadline_exceeded) ends the
// ascent; other errors are returned.
// reserve_top: K <= L - reserve_top (ferry train's numeric --device-update-layers n needs n
// non-resident layers for its tail: the executor refuses more).
Result<ResidentSearch> search_resident(const PlanProblem& p, const Planner& solve, int forced,
                                       int reserve_top = 0);

// A Planner that runs search_resident around `solve`: what ferry plan's batch search, the
// executor-checked solve and the comparison call.
Planner resident_planner(Planner solve, int forced, int reserve_top = 0);

}  // namespace ferry::plan
