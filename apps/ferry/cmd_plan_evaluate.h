// SPDX-License-Identifier: Apache-2.0
// `ferry plan --evaluate PLAN.json`: a solved plan priced again at other rates (plan/reprice.h),
// without re-solving: the plan's step as solved, the same plan at the given rates, and where a
// `ferry bench train` report ran it, the measured step beside both.
//   ferry plan --evaluate plan.json --nvme-read-gbps 2.1 --nvme-write-gbps 2.8
//   ferry plan --evaluate plan.json --from-bench report.json     (the executor's own disk rates)
// (File prefix cmd_plan_: built only with ferry_plan, like the subcommand it serves.)
#pragma once

#include <string>

#include "core/result.h"

namespace ferry::app {

struct PlanEvaluateArgs {
  std::string plan_path;      // a ferry plan --json document (with its "problem")
  std::string bench_path;     // optional ferry bench train report: disk rates + measured step
  double nvme_read_gbps = 0;  // > 0: in place of the plan's (and the report's)
  double nvme_write_gbps = 0;
  double link_gbps = 0;  // > 0: h2d = d2h = X, duplex 1.8X, loaded 1.5X (as ferry plan --link-gbps)
  std::string json_out;  // optional: the result as JSON
};

Status run_plan_evaluate(const PlanEvaluateArgs& a);

}  // namespace ferry::app
