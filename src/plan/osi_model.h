// SPDX-License-Identifier: Apache-2.0
// Loads a LinearModel into COIN-OR's Clp solver interface (quiet). Internal to src/plan: the only
// header outside the .cpp files that includes COIN-OR headers, so no other target sees them.
#pragma once

#include <memory>

#include <coin/OsiClpSolverInterface.hpp>

#include "plan/schedule_model.h"

namespace ferry::plan::detail {

std::unique_ptr<OsiClpSolverInterface> make_osi(const LinearModel& m);

}  // namespace ferry::plan::detail
