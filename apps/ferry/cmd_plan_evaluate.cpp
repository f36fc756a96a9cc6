// SPDX-License-Identifier: Apache-2.0
#include "apps/ferry/cmd_plan_evaluate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "core/file_util.h"
#include "core/json.h"
#include "core/log.h"
#include "plan/bench_profile.h"
#include "plan/plan_json.h"
#include "plan/problem.h"
#include "plan/reprice.h"
#include "train/stream/plan_policy.h"

namespace ferry::app {
namespace {

// The report's run of this very plan, whatever path the file had on the machine that ran it: a
// plan=FILE policy carries the document's fingerprint (train_bench.cpp plan_fingerprint), so a
// run is this plan's when the fingerprints are equal. Reports from before the fingerprint (none
// in the run) are matched by the predicted step the run copied from the file (the same double),
// which a different document with the same predicted step would match too.
const Json* run_of_plan(const Json& report, const std::string& fingerprint,
                        double predicted_step_ms) {
  for (const Json& run : report.at("policies")) {
    if (run.contains("error")) continue;
    const auto fp = run.find("plan_fingerprint");
    if (fp != run.end() && fp->is_string()) {
      if (fp->get<std::string>() == fingerprint) return &run;
      continue;
    }
    const auto it = run.find("predicted_step_ms");
    if (it != run.end() && it->is_number() && it->get<double>() == predicted_step_ms) return &run;
  }
  return nullptr;
}

std::string homes_text(const plan::Plan& pl) {
  std::map<std::string, int> n;
  for (const plan::Home h : pl.homes) ++n[std::string(plan::to_string(h))];
  std::string s;
  for (const auto& [home, count] : n)
    s += fmt::format("{}{} {}", s.empty() ? "" : ", ", home, count);
  return s;
}

std::string row(const char* name, const plan::Prediction& q, const plan::LinkRates& r) {
  return fmt::format(
      "{:<10} {:>9.1f} {:>10.1f} {:>11.1f} {:>12.1f} {:>10.1f} {:>8.1f}   {:>22}   {:>14}\n", name,
      q.step_ms, q.exposed_ms, q.nvme_store_ms, q.nvme_fetch_ms, q.optimizer_wait_ms, q.tflops,
      fmt::format("{:.2f} / {:.2f}", r.nvme_write_gbps, r.nvme_read_gbps),
      fmt::format("{:.2f} / {:.2f}", r.h2d_gbps, r.d2h_gbps));
}

}  // namespace

Status run_plan_evaluate(const PlanEvaluateArgs& a) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(a.plan_path));
  FERRY_ASSIGN_OR_RETURN(const Json doc, parse_json(text, a.plan_path));
  const std::string fingerprint = train::stream::plan_fingerprint(doc);  // its runs carry it
  FERRY_ASSIGN_OR_RETURN(const plan::Plan pl, plan::plan_from_json(doc));
  FERRY_ASSIGN_OR_RETURN(const std::optional<plan::PlanProblem> problem,
                         plan::plan_problem_from_json(doc));
  if (!problem) {
    return invalid_argument(
        "plan: --evaluate {}: the document has no \"problem\" (the costs and capacities it was "
        "solved for), so it cannot be priced again; solve it again with ferry plan --json",
        a.plan_path);
  }

  plan::RateOverrides o;
  std::string source;  // where the re-priced rates come from
  Json report;
  const Json* measured = nullptr;
  if (!a.bench_path.empty()) {
    FERRY_ASSIGN_OR_RETURN(report, plan::read_bench_report(a.bench_path, "--from-bench"));
    measured = run_of_plan(report, fingerprint, pl.predicted.step_ms);
    const std::optional<plan::ExecutorDiskRates> d = plan::executor_disk_rates(report);
    if (!(problem->nvme_cap_gb > 0)) {
      source = "NVMe: the plan was solved without an NVMe tier";
    } else if (d) {
      o.nvme_write_gbps = d->write_gbps;
      o.nvme_read_gbps = d->read_gbps;
      source = fmt::format("NVMe: the executor's disk calls in policy {} of {}", d->policy,
                           a.bench_path);
    } else {
      source =
          fmt::format("NVMe: no run of {} moved bytes to NVMe; the plan's rates", a.bench_path);
    }
  }
  if (a.nvme_read_gbps > 0) o.nvme_read_gbps = a.nvme_read_gbps;
  if (a.nvme_write_gbps > 0) o.nvme_write_gbps = a.nvme_write_gbps;
  if (a.nvme_read_gbps > 0 || a.nvme_write_gbps > 0) {
    source = "NVMe: --nvme-read-gbps / --nvme-write-gbps (where given)";
  }
  if (a.link_gbps > 0) {
    plan::LinkRates link;
    plan::set_symmetric_link(link, a.link_gbps);
    o.h2d_gbps = link.h2d_gbps;
    o.d2h_gbps = link.d2h_gbps;
    o.duplex_gbps = link.duplex_gbps;
    o.duplex_loaded_gbps = link.duplex_loaded_gbps;
    source += fmt::format("{}link: --link-gbps {}", source.empty() ? "" : "; ", a.link_gbps);
  }
  if (source.empty()) source = "no rate given: the plan's own";
  FERRY_ASSIGN_OR_RETURN(const plan::Repricing r, plan::reprice(*problem, pl, o));

  std::printf("plan %s: batch %d x %d, %d layers; homes %s\n", a.plan_path.c_str(), pl.batch_size,
              pl.seq_len, pl.num_layers, homes_text(pl).c_str());
  std::printf("%-10s %9s %10s %11s %12s %10s %8s   %s   %s\n", "", "step ms", "exposed ms",
              "nvme stores", "nvme fetches", "opt wait", "TFLOPS", "NVMe write / read GB/s",
              "h2d / d2h GB/s");
  std::printf("%s", row("as solved", r.as_solved, r.solved_rates).c_str());
  std::printf("%s", row("re-priced", r.at_rates, r.rates).c_str());
  std::printf("rates: %s\n", source.c_str());
  // The evaluator re-derives the step from the plan; the document's own figure came from the
  // solver. They agree for every plan ferry plan writes (evaluate.h); a difference means a document
  // of another version or edited by hand, and is said rather than hidden.
  const double stored = pl.predicted.step_ms;
  if (std::abs(r.as_solved.step_ms - stored) > 1e-6 * std::max(1.0, std::abs(stored))) {
    log::get("plan")->warn(
        "--evaluate {}: the evaluator gives {:.3f} ms for the plan as solved, the document says "
        "{:.3f} ms (another version's document?)",
        a.plan_path, r.as_solved.step_ms, stored);
  }
  Json out = {{"plan", a.plan_path},
              {"rates_from", source},
              {"solved_rates", plan::to_json(r.solved_rates)},
              {"rates", plan::to_json(r.rates)},
              {"as_solved", plan::prediction_to_json(r.as_solved)},
              {"re_priced", plan::prediction_to_json(r.at_rates)}};
  if (!a.bench_path.empty()) {
    double m = 0;  // the run's mean step (ms); 0: no run of this plan with one
    if (measured != nullptr) {
      const auto it = measured->find("step_ms_mean");
      if (it != measured->end() && it->is_number()) m = it->get<double>();
    }
    if (m > 0) {
      std::printf("measured: %.1f ms (policy %s of %s): as solved %+.1f %%, re-priced %+.1f %%\n",
                  m, measured->value("policy", "?").c_str(), a.bench_path.c_str(),
                  100.0 * (r.as_solved.step_ms / m - 1.0), 100.0 * (r.at_rates.step_ms / m - 1.0));
      out["measured_step_ms"] = m;
      out["measured_policy"] = measured->value("policy", "?");
      out["error_as_solved"] = r.as_solved.step_ms / m - 1.0;
      out["error_re_priced"] = r.at_rates.step_ms / m - 1.0;
    } else {
      std::printf(
          "measured: no run of %s is this plan (no policy ran a document with its fingerprint "
          "%s; reports without fingerprints: none's predicted step is %.6f ms)\n",
          a.bench_path.c_str(), fingerprint.c_str(), stored);
    }
  }
  std::fflush(stdout);
  if (!a.json_out.empty()) FERRY_TRY(write_file_atomic(a.json_out, out.dump(2) + "\n"));
  return ok_status();
}

}  // namespace ferry::app
