// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/split_controller.h"

#include <cstdlib>

namespace ferry::serve::wsa {

double SplitController::migration_s(const SplitProblem& p, const Split& from,
                                    const Split& to) const {
  if (cfg_.link_bytes_per_s <= 0) return 0;
  std::size_t slots = 0;
  for (std::size_t l = 0; l < from.slots.size() && l < to.slots.size(); ++l) {
    slots += std::size_t(std::abs(from.slots[l] - to.slots[l]));
  }
  return double(slots) * double(p.expert_bytes) / cfg_.link_bytes_per_s;
}

Result<Decision> SplitController::decide(const SplitProblem& p, const Split& current) const {
  Decision d;
  FERRY_ASSIGN_OR_RETURN(d.target, allocate(p));
  d.target_s = modelled_step_s(p, d.target);
  d.current_s = modelled_step_s(p, current);
  d.migration_s = migration_s(p, current, d.target);
  const double gain = d.current_s - d.target_s;
  // An infeasible current split (e.g. the first decision after a floor change) always moves.
  d.move = !feasible(p, current) || (d.target != current && gain >= cfg_.hysteresis * d.current_s &&
                                     gain > 0 && gain * cfg_.horizon_steps >= d.migration_s);
  return d;
}

}  // namespace ferry::serve::wsa
