// SPDX-License-Identifier: Apache-2.0
// Human-readable text of a plan and of a policy comparison (what `ferry plan` prints on stdout).
#pragma once

#include <string>

#include "plan/compare.h"
#include "plan/plan.h"
#include "plan/problem.h"

namespace ferry::plan {

// Per boundary: home or recompute, whether the layer it feeds keeps its internals, and its span;
// per window: compute, exposed transfer, GPU memory; then the predicted step, TFLOPS, peak memory
// per tier and the kept internals (layers, GPU bytes, re-forward saved).
std::string plan_text(const PlanProblem& p, const Plan& plan);
std::string comparison_text(const Comparison& c);

}  // namespace ferry::plan
