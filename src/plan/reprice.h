// SPDX-License-Identifier: Apache-2.0
// A solved plan priced again at other link and disk rates (`ferry plan --evaluate`, issue #7):
// the plan's own decisions (homes, spans, transfer windows, kept internals, resident layers, the
// device tail) under the problem it was solved for (the copy in its JSON), with only the rates
// replaced, through the independent evaluator (evaluate.h). Nothing is re-solved: the answer is
// what the model says this very plan takes where the link or the disk runs at those rates, so a
// measured step can be set against the model at the rates the executor itself saw (on the H100
// of session 32 the plan's NVMe step was over-predicted 15 % at the machine profile's disk rates;
// docs/plan.md "Re-pricing a plan").
// Tested in tests/unit/plan/reprice_test.cpp and tests/cli/plan_nvme_from_bench.sh.
#pragma once

#include <optional>

#include "core/result.h"
#include "plan/plan.h"
#include "plan/problem.h"

namespace ferry::plan {

// Rates to put in place of the problem's; an unset field keeps the problem's rate.
struct RateOverrides {
  std::optional<double> h2d_gbps, d2h_gbps, duplex_gbps, duplex_loaded_gbps;
  std::optional<double> nvme_read_gbps, nvme_write_gbps;
};

struct Repricing {
  LinkRates solved_rates;  // the problem's, as the plan was solved
  LinkRates rates;         // the ones priced here
  Prediction as_solved;    // evaluate() at the solved rates (equals the plan's own prediction)
  Prediction at_rates;     // evaluate() at `rates`
};

// invalid_argument for a rate that is not positive and finite, or NVMe rates for a problem with
// no NVMe tier; the evaluator's error for a plan that does not belong to the problem.
Result<Repricing> reprice(const PlanProblem& p, const Plan& plan, const RateOverrides& o);

}  // namespace ferry::plan
