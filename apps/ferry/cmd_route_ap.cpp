// SPDX-License-Identifier: Apache-2.0
// `ferry route ap`: scores a detection file against ground truth in the bgt-ada text format
// (frame_id,obj_id,left,top,width,height,confidence,class) with VOC07/VOC12/COCO/pooled AP.
// Results to stdout: one "class=<c> ap=<v>" line per class, then a summary line.
#include <cstdio>
#include <string>

#include "apps/ferry/commands.h"
#include "route/ap.h"

namespace ferry::app {
namespace {

struct ApConfig {
  std::string gt_path, dets_path, metric = "voc07", class_map_path;
  double iou = 0.5;
  bool no_rank_normalize = false;
};

int run_ap(const ApConfig& c) {
  auto metric = route::parse_ap_metric(c.metric);
  if (!metric.ok()) return fail(metric.status());
  auto gts = route::load_ground_truth(c.gt_path);
  if (!gts.ok()) return fail(gts.status());
  auto dets = route::load_detections(c.dets_path, route::Source::kWeak);
  if (!dets.ok()) return fail(dets.status());
  route::ClassMap cmap;
  if (!c.class_map_path.empty()) {
    auto m = route::ClassMap::load(c.class_map_path);
    if (!m.ok()) return fail(m.status());
    cmap = std::move(m).value();
  }
  route::ApOptions opts;
  opts.iou_threshold = c.iou;
  opts.class_map = &cmap;
  opts.rank_normalize = !c.no_rank_normalize;
  auto rep = route::evaluate_ap(*gts, *dets, *metric, opts);
  if (!rep.ok()) return fail(rep.status());
  for (const auto& [cls, ap] : rep->per_class) std::printf("class=%s ap=%.6f\n", cls.c_str(), ap);
  std::printf("metric=%s classes=%zu gt=%d dets=%d mAP=%.6f\n",
              std::string(route::to_string(rep->metric)).c_str(), rep->per_class.size(),
              rep->num_gt, rep->num_det, rep->mean);
  return 0;
}

void register_route_ap(CLI::App& app, CommandFn& run) {
  auto cfg = std::make_shared<ApConfig>();
  auto* cmd = route_cmd(app)->add_subcommand("ap", "average precision of a detection file");
  cmd->add_option("--gt", cfg->gt_path, "ground-truth file (artifact text format)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--dets", cfg->dets_path, "detection file (artifact text format)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--metric", cfg->metric, "voc07 | voc12 | coco | coco50 | pooled11")
      ->check(CLI::IsMember({"voc07", "voc12", "coco", "coco50", "pooled11"}))
      ->envname("FERRY_ROUTE_METRIC");
  cmd->add_option("--iou", cfg->iou, "IoU threshold for VOC and pooled metrics")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--class-map", cfg->class_map_path,
                  "lines 'det_class gt_class' mapping detector to GT class names")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--no-rank-normalize", cfg->no_rank_normalize,
                "pooled11: keep raw confidences instead of per-model percentile ranks");
  cmd->callback([&run, cfg] { run = [cfg] { return run_ap(*cfg); }; });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_route_ap);
}  // namespace ferry::app
