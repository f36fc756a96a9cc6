// SPDX-License-Identifier: Apache-2.0
// `ferry route demo`: the embedded default. Draws synthetic scenes and runs the weak and strong
// detectors and both estimators on the pixels (scene_detectors.h; `--scenes boxes` uses the
// faster box-level records of synthetic.h instead), tunes the router on the calibration half,
// replays skipping, conditioned and adaptive routing on the (optionally shifted) test half, and
// prints accuracy vs ρ, realised ρ and the latency table. CPU-only, seconds.
#include <cstdio>
#include <string>

#include "apps/ferry/commands.h"
#include "route/ap.h"
#include "route/replay.h"
#include "route/scene_detectors.h"
#include "route/synthetic.h"

namespace ferry::app {
namespace {

struct DemoConfig {
  int frames = 1200;
  double shift = 0.1, rtt_ms = 20, uplink_mbps = 20, frame_kib = 48;
  std::uint64_t seed = 1;
  std::string scenes = "images";
  std::string dump_frames;
};

int run_demo(const DemoConfig& c) {
  route::RecordSet all;
  if (c.scenes == "images") {
    route::SceneRecordOptions so;
    so.frames = c.frames;
    so.test_shift = c.shift;
    so.seed = c.seed;
    so.dump_dir = c.dump_frames;
    auto r = route::make_scene_records(so);
    if (!r.ok()) return fail(r.status());
    all = std::move(*r);
  } else {
    route::SyntheticOptions so;
    so.frames = c.frames;
    so.test_shift = c.shift;
    so.seed = c.seed;
    all = route::make_synthetic_records(so);
  }
  const route::RecordSet calib = all.subset("calib"), test = all.subset("test");
  route::ReplayOptions o;
  o.cost = {24.695, 44.124, 3.079, 0,
            4.49,   280.37, 0.153, {c.rtt_ms, c.uplink_mbps, c.frame_kib * 1024, 0}};
  auto t = route::tune_router(calib, "skip", "cond", o, 0.0);
  if (!t.ok()) return fail(t.status());
  std::printf("# synthetic %s: %zu calib, %zu test frames, test difficulty shift %.2f\n",
              c.scenes == "images" ? "drawn scenes (detectors and estimators run on pixels)"
                                   : "box-level records",
              calib.frames.size(), test.frames.size(), c.shift);
  for (const auto* split : {&calib, &test}) {
    auto w = route::evaluate_ap(split->gts, split->weak, route::ApMetric::kVoc07, {});
    auto st = route::evaluate_ap(split->gts, split->strong, route::ApMetric::kVoc07, {});
    if (w.ok() && st.ok()) {
      std::printf("# %s: VOC07 mAP weak-only %.4f strong-only %.4f\n",
                  split == &calib ? "calib" : "test", w->mean, st->mean);
    }
  }
  std::printf("# tuned on calib only: rho_frontier=%.1f rho_ceiling=%.1f\n", t->envelope.frontier,
              t->envelope.ceiling);
  std::vector<route::ReplayRow> rows[3];
  auto s = route::replay_placement(test, "skip", route::Placement::kSkip, "skip",
                                   t->router.skip_calibration, o);
  auto d = route::replay_placement(test, "cond", route::Placement::kCond, "cond",
                                   t->router.cond_calibration, o);
  auto a = route::replay_router(test, t->router, o);
  if (!s.ok()) return fail(s.status());
  if (!d.ok()) return fail(d.status());
  if (!a.ok()) return fail(a.status());
  rows[0] = *s, rows[1] = *d, rows[2] = *a;
  std::printf(
      "ratio | mAP skip  cond  adaptive(placement) | realised skip cond adaptive | "
      "latency_ms cond skip (net %.1f ms)\n",
      o.cost.net.transfer_ms());
  for (std::size_t i = 0; i < rows[0].size(); ++i) {
    std::printf("%.1f   | %.4f %.4f %.4f(%s)       | %.3f %.3f %.3f         | %.2f %.2f\n",
                rows[0][i].ratio, rows[0][i].map, rows[1][i].map, rows[2][i].map,
                std::string(route::to_string(rows[2][i].placement)).c_str(), rows[0][i].realised,
                rows[1][i].realised, rows[2][i].realised, rows[1][i].latency_ms,
                rows[0][i].latency_ms);
  }
  for (int k = 0; k < 3; ++k) {
    const route::Curve cv = route::curve_from_rows(rows[k]);
    auto auc = route::auc_trapezoid(cv.ratio, cv.map);
    std::printf("auc %s=%.4f\n",
                k == 0   ? "skip"
                : k == 1 ? "cond"
                         : "adaptive",
                auc.ok() ? *auc : 0.0);
  }
  return 0;
}

void register_route_demo(CLI::App& app, CommandFn& run) {
  auto c = std::make_shared<DemoConfig>();
  auto* cmd = route_cmd(app)->add_subcommand("demo", "synthetic end-to-end routing demo (CPU)");
  cmd->add_option("--frames", c->frames, "synthetic frames (half calib, half test)")
      ->check(CLI::Range(100, 200000));
  cmd->add_option("--shift", c->shift, "difficulty shift of the test half")
      ->check(CLI::Range(-1.0, 1.0));
  cmd->add_option("--rtt-ms", c->rtt_ms, "network round trip")->check(CLI::Range(0.0, 1e5));
  cmd->add_option("--uplink-mbps", c->uplink_mbps, "uplink bandwidth")->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--frame-kib", c->frame_kib, "bytes per offloaded frame, KiB")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--seed", c->seed, "generator seed");
  cmd->add_option("--scenes", c->scenes,
                  "images: drawn frames + detectors; boxes: box-level records")
      ->check(CLI::IsMember({"images", "boxes"}));
  cmd->add_option("--dump-frames", c->dump_frames, "write the drawn frames there as PPM");
  cmd->callback([&run, c] { run = [c] { return run_demo(*c); }; });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_route_demo);
}  // namespace ferry::app
