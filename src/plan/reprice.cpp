// SPDX-License-Identifier: Apache-2.0
#include "plan/reprice.h"

#include <cmath>

#include "plan/evaluate.h"

namespace ferry::plan {
namespace {

Status put(const std::optional<double>& v, const char* name, double& rate) {
  if (!v) return ok_status();
  if (!(*v > 0) || !std::isfinite(*v)) {
    return invalid_argument("plan: {} {} is not a positive rate (GB/s)", name, *v);
  }
  rate = *v;
  return ok_status();
}

}  // namespace

Result<Repricing> reprice(const PlanProblem& p, const Plan& plan, const RateOverrides& o) {
  if ((o.nvme_read_gbps || o.nvme_write_gbps) && !(p.nvme_cap_gb > 0)) {
    return invalid_argument(
        "plan: NVMe rates given for a plan solved without an NVMe tier (no boundary can be on "
        "NVMe: nothing to re-price there)");
  }
  Repricing r;
  r.solved_rates = p.link;
  PlanProblem q = p;
  FERRY_TRY(put(o.h2d_gbps, "h2d", q.link.h2d_gbps));
  FERRY_TRY(put(o.d2h_gbps, "d2h", q.link.d2h_gbps));
  FERRY_TRY(put(o.duplex_gbps, "duplex", q.link.duplex_gbps));
  FERRY_TRY(put(o.duplex_loaded_gbps, "duplex (loaded)", q.link.duplex_loaded_gbps));
  FERRY_TRY(put(o.nvme_read_gbps, "NVMe read", q.link.nvme_read_gbps));
  FERRY_TRY(put(o.nvme_write_gbps, "NVMe write", q.link.nvme_write_gbps));
  r.rates = q.link;
  FERRY_ASSIGN_OR_RETURN(r.as_solved, evaluate(p, plan));
  FERRY_ASSIGN_OR_RETURN(r.at_rates, evaluate(q, plan));
  return r;
}

}  // namespace ferry::plan
