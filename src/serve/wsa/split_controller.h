// SPDX-License-Identifier: Apache-2.0
// The live MV-WSA decision rule: given the current split and fresh curves, move to the
// allocator's split only when it pays, so a stationary workload settles instead of oscillating.
// A move is taken iff both
//   gain = T(current) - T(target) >= hysteresis * T(current)          (relative threshold)
//   gain * horizon_steps >= migration_s                               (pays back its copies)
// where T is the modelled step time on the current curves and migration_s is the time to re-page
// what the move displaces: each slot a layer loses held a (resident) expert that may have to come
// back, each slot a layer gains is filled by a miss, so |delta slots| * expert_bytes / link; KV
// blocks move only when free (shrink) or are simply added (grow), costing nothing.
// What this guarantees (tested in wsa_controller_test.cpp): every split it returns is feasible
// (budget, slot range, KV floor); when it keeps the current split, that split's T is within
// max(hysteresis * T, migration_s / horizon_steps) of the allocator's optimum on the same curves.
#pragma once

#include <optional>

#include "serve/wsa/split_allocator.h"

namespace ferry::serve::wsa {

struct ControllerConfig {
  double hysteresis = 0.05;     // relative gain a move must promise
  double horizon_steps = 256;   // steps over which a move must repay its migration
  double link_bytes_per_s = 0;  // for migration_s (0: migration is free)
};

struct Decision {
  Split target;          // the allocator's split on these curves
  double current_s = 0;  // modelled step time of the current split
  double target_s = 0;   // ... of the target
  double migration_s = 0;
  bool move = false;  // take target (else keep current)
};

class SplitController {
 public:
  explicit SplitController(ControllerConfig cfg) : cfg_(cfg) {}
  // current must have one entry per MoE layer of p. Errors: the allocator's.
  Result<Decision> decide(const SplitProblem& p, const Split& current) const;
  double migration_s(const SplitProblem& p, const Split& from, const Split& to) const;

 private:
  ControllerConfig cfg_;
};

}  // namespace ferry::serve::wsa
