// SPDX-License-Identifier: Apache-2.0
// A SplitProblem (the curves a LiveSplit recorded while serving, and the sizes and costs around
// them) as JSON, so the configurator can run in another process than the run that profiled the
// workload: serve_split_engine_bench --save-profile FILE in one device call, --configurator-profile
// FILE in the next (docs/serve_wsa.md, "48-layer run"). Not the same input as `ferry serve
// --plan-only --trace FILE`: that builds its curves from a routing trace with no schedule (every
// routed token, concurrency tokens per step); a profile holds the schedule's own per-step curves,
// KV demand and prefix curve, which is what the in-process configurator uses.
// Invariant: load(save(p)) == p exactly (doubles are written with round-trip precision), so the
// allocator picks the same split from a file as from the in-process profile
// (tests/unit/serve/wsa_profile_test.cpp). A file carries a free-form `meta` object (what produced
// it: geometry, workload, budget) that the caller checks against its own run.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "serve/wsa/split_allocator.h"

namespace ferry::serve::wsa {

struct SplitProfile {
  SplitProblem problem;
  nlohmann::json meta = nlohmann::json::object();  // the producer's description
};

// {"budget_bytes": .., "expert_bytes": .., ..., "expert_misses": [[..], ..], "kv_short": [..]}
nlohmann::json split_problem_to_json(const SplitProblem& p);
// corrupt() on a missing key, a wrong type or a non-finite number; invalid_argument on curves of
// unequal lengths.
Result<SplitProblem> split_problem_from_json(const nlohmann::json& j);

// File: {"kind": "ferry.wsa.split_profile", "version": 1, "meta": {..}, "problem": {..}}.
Status save_split_profile(const std::string& path, const SplitProfile& profile);
Result<SplitProfile> load_split_profile(const std::string& path);

}  // namespace ferry::serve::wsa
