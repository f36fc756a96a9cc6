// SPDX-License-Identifier: Apache-2.0
// `ferry route tune` and `ferry route eval`: offline tools over per-frame records (records.h).
// tune: curves per placement, envelope and router JSON from the calibration split only.
// eval: replays fixed placements and the router on the test split: artifact-compatible CSV
// (estimator, ratio, mAP, mAP_coco, mAP_coco50, ...) with realised ratio, latency, compute, CI.
#include <cstdio>
#include <string>

#include "apps/ferry/commands.h"
#include "core/file_util.h"
#include "route/replay.h"

namespace ferry::app {
namespace {

struct TuneConfig {
  std::string records, out = "router.json", curves_out, skip_col = "skip", cond_col = "cond";
  std::string router_path, controller = "feedback";
  double lambda_per_ms = 0, t_weak_ms = 24.695, t_strong_ms = 44.124, t_est_ms = 3.079;
  double rtt_ms = 0, uplink_mbps = 0, frame_kib = 0, queue_ms = 0;
  int bootstrap = 0;
  bool cost_aware = false;
};

route::ReplayOptions replay_options(const TuneConfig& c) {
  route::ReplayOptions o;
  o.controller =
      c.controller == "paper" ? route::ControllerKind::kPaper : route::ControllerKind::kFeedback;
  o.bootstrap = c.bootstrap;
  o.cost.t_weak_ms = c.t_weak_ms;
  o.cost.t_strong_ms = c.t_strong_ms;
  o.cost.t_est_skip_ms = c.t_est_ms;
  o.cost.g_weak = 4.49;  // the paper's detectors (route.md); only used for the compute column
  o.cost.g_est_skip = 0.153;
  o.cost.net = {c.rtt_ms, c.uplink_mbps, c.frame_kib * 1024, c.queue_ms};
  return o;
}

void add_cost_flags(CLI::App* cmd, TuneConfig& c) {
  cmd->add_option("--t-weak-ms", c.t_weak_ms, "weak detector latency")->check(CLI::Range(0.0, 1e4));
  cmd->add_option("--t-strong-ms", c.t_strong_ms, "strong detector latency")
      ->check(CLI::Range(0.0, 1e4));
  cmd->add_option("--t-est-ms", c.t_est_ms, "pixel estimator latency")->check(CLI::Range(0.0, 1e4));
  cmd->add_option("--rtt-ms", c.rtt_ms, "network round trip")->check(CLI::Range(0.0, 1e5));
  cmd->add_option("--uplink-mbps", c.uplink_mbps, "uplink bandwidth (0 = unlimited)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--frame-kib", c.frame_kib, "bytes uploaded per offloaded frame, KiB")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--queue-ms", c.queue_ms, "server queueing delay")->check(CLI::Range(0.0, 1e5));
  cmd->add_option("--controller", c.controller, "paper | feedback")
      ->check(CLI::IsMember({"paper", "feedback"}));
}

int run_tune(const TuneConfig& c) {
  auto rec = route::load_records(c.records);
  if (!rec.ok()) return fail(rec.status());
  const route::RecordSet calib = rec->subset("calib");
  if (calib.frames.empty()) return fail(invalid_argument("route: tune: no 'calib' frames"));
  auto t = route::tune_router(calib, c.skip_col, c.cond_col, replay_options(c), c.lambda_per_ms);
  if (!t.ok()) return fail(t.status());
  const route::TunedRouter& chosen = c.cost_aware ? t->cost_router : t->router;
  if (Status s = write_file_atomic(c.out, chosen.to_json().dump(1) + "\n"); !s.ok()) return fail(s);
  std::vector<route::ReplayRow> rows = t->skip_rows;
  rows.insert(rows.end(), t->cond_rows.begin(), t->cond_rows.end());
  const std::string csv = route::replay_rows_to_csv(rows);
  if (!c.curves_out.empty()) {
    if (Status s = write_file_atomic(c.curves_out, csv); !s.ok()) return fail(s);
  } else {
    std::fputs(csv.c_str(), stdout);
  }
  std::printf("calib_frames=%zu rho_frontier=%.1f rho_ceiling=%.1f router=%s\n",
              calib.frames.size(), t->envelope.frontier, t->envelope.ceiling, c.out.c_str());
  return 0;
}

int run_eval(const TuneConfig& c) {
  auto rec = route::load_records(c.records);
  if (!rec.ok()) return fail(rec.status());
  auto text = read_file(c.router_path);
  if (!text.ok()) return fail(text.status());
  auto j = parse_json(*text, c.router_path);
  if (!j.ok()) return fail(j.status());
  auto router = route::TunedRouter::from_json(*j);
  if (!router.ok()) return fail(router.status());
  const route::RecordSet test = rec->subset("test");
  const route::ReplayOptions o = replay_options(c);
  std::vector<route::ReplayRow> rows;
  for (const auto& [name, p, col, cal] :
       {std::tuple{"skip", route::Placement::kSkip, router->skip_column, router->skip_calibration},
        std::tuple{"cond", route::Placement::kCond, router->cond_column,
                   router->cond_calibration}}) {
    auto r = route::replay_placement(test, name, p, col, cal, o);
    if (!r.ok()) return fail(r.status());
    rows.insert(rows.end(), r->begin(), r->end());
  }
  auto a = route::replay_router(test, *router, o);
  if (!a.ok()) return fail(a.status());
  rows.insert(rows.end(), a->begin(), a->end());
  std::fputs(route::replay_rows_to_csv(rows).c_str(), stdout);
  for (const char* name : {"skip", "cond", "adaptive"}) {
    std::vector<route::ReplayRow> sub;
    for (const auto& r : rows) {
      if (r.estimator == name) sub.push_back(r);
    }
    const route::Curve cv = route::curve_from_rows(sub);
    auto auc = route::auc_trapezoid(cv.ratio, cv.map);
    double worst = 0;
    for (const auto& r : sub) worst = std::max(worst, std::abs(r.realised - r.ratio));
    std::printf("# %s test_frames=%zu auc=%.4f max_ratio_error=%.4f\n", name, test.frames.size(),
                auc.ok() ? *auc : 0.0, worst);
  }
  return 0;
}

void register_route_tune(CLI::App& app, CommandFn& run) {
  auto c = std::make_shared<TuneConfig>();
  auto* tune = route_cmd(app)->add_subcommand("tune", "tune a router on the calibration split");
  tune->add_option("--records", c->records, "records folder (frames.csv, gt/weak/strong.txt)")
      ->required()
      ->check(CLI::ExistingDirectory);
  tune->add_option("--out", c->out, "router JSON to write");
  tune->add_option("--curves-out", c->curves_out, "calibration curves CSV (default: stdout)");
  tune->add_option("--skip-column", c->skip_col, "score column of the pixel estimator");
  tune->add_option("--cond-column", c->cond_col, "score column of the conditioned estimator");
  tune->add_option("--lambda-per-ms", c->lambda_per_ms, "cost-aware: mAP traded per ms")
      ->check(CLI::Range(0.0, 1.0));
  tune->add_flag("--cost-aware", c->cost_aware, "write the cost-aware router");
  add_cost_flags(tune, *c);
  tune->callback([&run, c] { run = [c] { return run_tune(*c); }; });

  auto e = std::make_shared<TuneConfig>();
  auto* ev = route_cmd(app)->add_subcommand("eval", "replay a router on the test split");
  ev->add_option("--records", e->records, "records folder")
      ->required()
      ->check(CLI::ExistingDirectory);
  ev->add_option("--router", e->router_path, "router JSON from `ferry route tune`")
      ->required()
      ->check(CLI::ExistingFile);
  ev->add_option("--bootstrap", e->bootstrap, "bootstrap resamples for mAP CIs")
      ->check(CLI::Range(0, 10000));
  add_cost_flags(ev, *e);
  ev->callback([&run, e] { run = [e] { return run_eval(*e); }; });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_route_tune);
}  // namespace ferry::app
