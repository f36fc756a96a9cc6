// SPDX-License-Identifier: Apache-2.0
// The run-time side of a plan (issue #7): per compute window, the measured time and exposed
// transfer time of the streaming executor (per step, averaged over the steps run) next to what
// the plan predicted. Printed by `ferry train` at the end of a stream run and written to the
// metrics JSONL as {"type": "windows", ...}.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"

namespace ferry::train::stream {

struct WindowReport {
  int layers = 0;
  std::int64_t steps = 0;                    // steps the averages are over
  std::vector<double> measured_ms;           // [2L+1] per step
  std::vector<double> measured_exposed_ms;   // [2L+1] per step
  std::vector<double> predicted_compute_ms;  // [2L+1] or empty (no plan)
  std::vector<double> predicted_exposed_ms;  // [2L+1] or empty
  double measured_step_ms = 0;               // mean step time
  double predicted_step_ms = 0;              // 0: no plan
};

// "f3", "loss", "b3" (the planner's names, plan/problem.h numbering).
std::string window_label(int layers, int t);
// Per-step means from cumulative window seconds over `steps` steps.
WindowReport make_window_report(int layers, std::int64_t steps, const std::vector<double>& window_s,
                                const std::vector<double>& window_exposed_s, double total_step_s);
std::string format_window_table(const WindowReport& r);
Json window_report_json(const WindowReport& r);

}  // namespace ferry::train::stream
