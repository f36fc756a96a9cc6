// SPDX-License-Identifier: Apache-2.0
// Budget controllers (see controller.h for the rules and the feedback bound).
#include "route/controller.h"

#include <algorithm>

namespace ferry::route {

bool EcdfThresholdController::decide(double score, double rho) {
  const double u = ecdf_(score);
  const double cut = 1.0 - rho;
  bool off = u > cut;
  if (u == cut) {
    // Exact tie: offload while the running count is under budget.
    off = static_cast<double>(offloaded()) < rho * static_cast<double>(frames() + 1);
  }
  count(off);
  return off;
}

bool FeedbackController::decide(double score, double rho) {
  const double u = ecdf_(score);
  const bool off = u > (1.0 - rho) + gain_ * debt_;
  debt_ += (off ? 1.0 : 0.0) - rho;
  count(off);
  return off;
}

bool TokenBucket::admit(bool want) {
  tokens_ = std::min(burst_, tokens_ + rate_);
  if (!want || tokens_ < 1.0) return false;
  tokens_ -= 1.0;
  return true;
}

}  // namespace ferry::route
