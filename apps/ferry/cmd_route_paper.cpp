// SPDX-License-Identifier: Apache-2.0
// `ferry route paper`: replays the bgt-ada paper-data snapshot and prints the envelope table,
// ρ_frontier/ρ_ceiling, AUCρ per estimator and the cost figures (route.md "Targets").
#include <cstdio>
#include <string>

#include "apps/ferry/commands.h"
#include "route/paper_replay.h"

namespace ferry::app {
namespace {

int run_paper(const std::string& dir) {
  auto r = route::replay_paper_data(dir);
  if (!r.ok()) return fail(r.status());
  const route::PaperReplay& p = *r;
  const route::Curve& skip = p.curves.at(route::kPaperSkipEstimator);
  const route::Curve& cond = p.curves.at(route::kPaperCondEstimator);
  std::printf("ratio,skip_mAP,cond_mAP,envelope_mAP,placement,T_cond_ms,T_skip_ms\n");
  for (std::size_t i = 0; i < p.envelope.ratio.size(); ++i) {
    const double rho = p.envelope.ratio[i];
    std::printf("%.1f,%.4f,%.4f,%.4f,%s,%.2f,%.2f\n", rho, skip.map[i], cond.map[i],
                p.envelope.map[i], std::string(route::to_string(p.envelope.choice[i])).c_str(),
                p.cost.latency_ms(route::Placement::kCond, rho),
                p.cost.latency_ms(route::Placement::kSkip, rho));
  }
  std::printf("rho_frontier=%.1f rho_ceiling=%.1f\n", p.envelope.frontier, p.envelope.ceiling);
  for (const auto& [name, auc] : p.auc) std::printf("auc %s=%.4f\n", name.c_str(), auc);
  std::printf("saving_ms@%.1f=%.2f saving_pct=%.1f gflops_saved=%.3f\n", p.rho_cost, p.saving_ms,
              p.saving_pct, p.gflops_saved);
  std::printf("break_even_latency=%.4f break_even_compute=%.4f estimator_lighter=%.1fx\n",
              p.latency_break_even, p.compute_break_even, p.lightness);
  return 0;
}

void register_route_paper(CLI::App& app, CommandFn& run) {
  auto dir =
      std::make_shared<std::string>(std::string(FERRY_SHARED_DIR) + "/data/bgt-ada/paper-data");
  auto* cmd = route_cmd(app)->add_subcommand("paper", "replay the bgt-ada paper-data curves");
  cmd->add_option("--data", *dir, "paper-data folder")
      ->check(CLI::ExistingDirectory)
      ->envname("FERRY_ROUTE_PAPER_DATA");
  cmd->callback([&run, dir] { run = [dir] { return run_paper(*dir); }; });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_route_paper);
}  // namespace ferry::app
