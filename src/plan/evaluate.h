// SPDX-License-Identifier: Apache-2.0
// The independent evaluator: re-derives a plan's cost and memory directly from the plan (homes,
// spans, transfers) by walking the step's windows, without the MILP. It is the referee of the
// solvers: tests check that every solver's plan passes check_fits() and that its predicted step
// equals the solver's objective. The accounting rules (what is resident in which window, which
// traffic each window carries) are written out in docs/plan.md; milp.cpp encodes the same rules
// as linear constraints, written separately on purpose.
#pragma once

#include "core/result.h"
#include "plan/plan.h"
#include "plan/problem.h"

namespace ferry::plan {

// Feasibility slack (GB) for byte sums and capacities: LP solutions satisfy equalities to ~1e-7.
inline constexpr double kGbTolerance = 1e-6;

// Checks the plan is well formed for `p` (a valid path with spans <= max_span, homes consistent
// with it, boundary L on the GPU, every offloaded boundary (0 included) moved out and back in full
// in allowed windows) and computes its Prediction. Capacities are not checked here.
Result<Prediction> evaluate(const PlanProblem& p, const Plan& plan);

// resource_exhausted naming the first tier (and window) over capacity, else ok.
Status check_fits(const PlanProblem& p, const Prediction& pred);

// Windows in which boundary i may be offloaded (D2H): [i, L-1] to host memory, [i, i] to NVMe
// (the executor stores an NVMe boundary as soon as it is produced, host blocked: the bytes are
// off the GPU from window i+1 on, and their time is the store's, nvme_store_window);
// brought back (H2D): [L, 2L-e] where e is the end of the span that starts at i (it must be on the
// GPU before the backward of layer e-1, which recomputes from it or, e = i+1, consumes it).
inline int first_d2h_window(const PlanProblem&, int i) { return i; }
inline int last_d2h_window(const PlanProblem& p, int) { return p.num_layers - 1; }
inline int last_nvme_d2h_window(const PlanProblem&, int i) { return i; }
inline int first_h2d_window(const PlanProblem& p, int) { return p.num_layers; }
inline int last_h2d_window(const PlanProblem& p, int span_end) {
  return 2 * p.num_layers - span_end;
}

}  // namespace ferry::plan
