// SPDX-License-Identifier: Apache-2.0
// Plan <-> JSON. The document holds the plan (homes, spans, transfers), its prediction (step
// time, per-window compute/exposure/GPU memory, peaks per tier) and solver info, plus an optional
// copy of the PlanProblem it was solved for, so `ferry train --plan FILE` (issue #4) can check it
// matches the run. Doubles are written with round-trip precision: read(write(p)) == p exactly.
//
//   {"format": "ferry-plan", "version": 1, "policy": "solved", "num_layers": 36, ...,
//    "boundaries": [{"boundary": 0, "home": "gpu"}, ...],
//    "spans": [{"start": 0, "end": 2, "keep_weights": false}, ...],
//    "keep_internals": [0, 1, ...] (L flags: layer j keeps its internals; absent in old documents),
//    "transfers": [{"boundary": 3, "window": 3, "direction": "d2h", "tier": "host", "gb": 0.1}],
//    "predicted": {...}, "solver": {...}, "problem": {...}}
#pragma once

#include <optional>
#include <string>

#include "core/json.h"
#include "core/result.h"
#include "plan/plan.h"
#include "plan/problem.h"

namespace ferry::plan {

Json plan_to_json(const Plan& plan, const PlanProblem* problem = nullptr);
// The document's "predicted" object.
Json prediction_to_json(const Prediction& r);
Result<Plan> plan_from_json(const Json& j);
// The embedded problem, when the document has one.
Result<std::optional<PlanProblem>> plan_problem_from_json(const Json& j);

Status write_plan_file(const std::string& path, const Plan& plan, const PlanProblem* problem);
Result<Plan> read_plan_file(const std::string& path);

}  // namespace ferry::plan
