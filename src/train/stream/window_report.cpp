// SPDX-License-Identifier: Apache-2.0
#include "train/stream/window_report.h"

#include <fmt/format.h>

namespace ferry::train::stream {

std::string window_label(int layers, int t) {
  if (t < layers) return fmt::format("f{}", t);
  if (t == layers) return "loss";
  return fmt::format("b{}", 2 * layers - t);
}

WindowReport make_window_report(int layers, std::int64_t steps, const std::vector<double>& window_s,
                                const std::vector<double>& window_exposed_s, double total_step_s) {
  WindowReport r;
  r.layers = layers;
  r.steps = steps;
  const double per = steps > 0 ? 1e3 / double(steps) : 0.0;
  for (double s : window_s) r.measured_ms.push_back(s * per);
  for (double s : window_exposed_s) r.measured_exposed_ms.push_back(s * per);
  r.measured_step_ms = total_step_s * per;
  return r;
}

std::string format_window_table(const WindowReport& r) {
  const bool plan = !r.predicted_exposed_ms.empty();
  std::string out = fmt::format("per-window times, ms per step (mean of {} steps){}\n", r.steps,
                                plan ? "; predicted by the plan" : "");
  out += plan ? fmt::format("{:>6} {:>10} {:>10} {:>10} {:>10}\n", "window", "time", "predicted",
                            "exposed", "predicted")
              : fmt::format("{:>6} {:>10} {:>10}\n", "window", "time", "exposed");
  double time_sum = 0, exposed_sum = 0, pred_c = 0, pred_e = 0;
  for (std::size_t t = 0; t < r.measured_ms.size(); ++t) {
    const std::string name = window_label(r.layers, static_cast<int>(t));
    time_sum += r.measured_ms[t];
    exposed_sum += r.measured_exposed_ms[t];
    if (plan) {
      pred_c += r.predicted_compute_ms[t] + r.predicted_exposed_ms[t];
      pred_e += r.predicted_exposed_ms[t];
      out += fmt::format("{:>6} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f}\n", name, r.measured_ms[t],
                         r.predicted_compute_ms[t] + r.predicted_exposed_ms[t],
                         r.measured_exposed_ms[t], r.predicted_exposed_ms[t]);
    } else {
      out += fmt::format("{:>6} {:>10.3f} {:>10.3f}\n", name, r.measured_ms[t],
                         r.measured_exposed_ms[t]);
    }
  }
  out += plan ? fmt::format("{:>6} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f}\n", "sum", time_sum,
                            pred_c, exposed_sum, pred_e)
              : fmt::format("{:>6} {:>10.3f} {:>10.3f}\n", "sum", time_sum, exposed_sum);
  out += fmt::format("step {:.3f} ms measured", r.measured_step_ms);
  if (r.predicted_step_ms > 0) {
    out += fmt::format(", {:.3f} ms predicted ({:+.1f} %)", r.predicted_step_ms,
                       100.0 * (r.measured_step_ms / r.predicted_step_ms - 1.0));
  }
  out += "\n";
  return out;
}

Json window_report_json(const WindowReport& r) {
  Json names = Json::array();
  for (std::size_t t = 0; t < r.measured_ms.size(); ++t)
    names.push_back(window_label(r.layers, static_cast<int>(t)));
  Json j{{"type", "windows"},
         {"steps", r.steps},
         {"window", names},
         {"measured_ms", r.measured_ms},
         {"measured_exposed_ms", r.measured_exposed_ms},
         {"measured_step_ms", r.measured_step_ms}};
  if (!r.predicted_exposed_ms.empty()) {
    j["predicted_compute_ms"] = r.predicted_compute_ms;
    j["predicted_exposed_ms"] = r.predicted_exposed_ms;
    j["predicted_step_ms"] = r.predicted_step_ms;
  }
  return j;
}

}  // namespace ferry::train::stream
