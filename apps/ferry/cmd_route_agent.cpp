// SPDX-License-Identifier: Apache-2.0
// `ferry route agent`: the edge agent (src/route/agent.h) as a process. Streams the records'
// split (a records folder, or the synthetic generator with the server's --synthetic-frames/
// --seed/--shift) against `ferry route serve`, and prints the JSON summary on stdout: frames and
// their accounting, realised ρ, fallbacks, latency percentiles, AP vs weak-only and strong-only.
// Without --router it tunes one on the calibration split first (ferry route tune's rule).
#include <cstdio>
#include <memory>

#include "apps/ferry/commands.h"
#include "core/file_util.h"
#include "core/json.h"
#include "core/log.h"
#include "route/agent.h"
#include "route/synthetic.h"
#include "route/transport/metrics_endpoint.h"

namespace ferry::app {
namespace {

struct AgentConfig {
  route::AgentOptions agent;
  std::string rho = "0.5", records, router, split = "test";
  int synthetic_frames = 1000;
  double shift = 0.1;
  std::uint64_t seed = 1;
  int metrics_port = -1;
};

int run_agent_cmd(AgentConfig c) {
  if (c.rho == "auto") {
    c.agent.rho_auto = true;
  } else {
    char* end = nullptr;
    c.agent.rho = std::strtod(c.rho.c_str(), &end);
    if (c.rho.empty() || *end != '\0' || !(c.agent.rho >= 0 && c.agent.rho <= 1)) {
      std::fprintf(stderr, "ferry: --rho must be a number in [0, 1] or 'auto', got '%s'\n",
                   c.rho.c_str());
      return 2;
    }
  }
  route::RecordSet all;
  if (!c.records.empty()) {
    auto r = route::load_records(c.records);
    if (!r.ok()) return fail(r.status());
    all = std::move(*r);
  } else {
    route::SyntheticOptions so;
    so.frames = c.synthetic_frames;
    so.test_shift = c.shift;
    so.seed = c.seed;
    all = route::make_synthetic_records(so);
  }
  route::TunedRouter router;
  if (!c.router.empty()) {
    auto text = read_file(c.router);
    if (!text.ok()) return fail(text.status());
    auto j = parse_json(*text, c.router);
    if (!j.ok()) return fail(j.status());
    auto r = route::TunedRouter::from_json(*j);
    if (!r.ok()) return fail(r.status());
    router = std::move(*r);
  } else {
    auto t = route::tune_router(all.subset("calib"), "skip", "cond", route::ReplayOptions{}, 0.0);
    if (!t.ok()) return fail(t.status().with_context("route agent: tuning on calib"));
    router = t->router;
    log::get("router")->info("route agent: tuned router on calib frontier={} ceiling={}",
                             t->envelope.frontier, t->envelope.ceiling);
  }
  const route::RecordSet split = c.split == "all" ? all : all.subset(c.split);
  route::PromRegistry reg;
  std::unique_ptr<route::MetricsEndpoint> ep;
  if (c.metrics_port >= 0) {
    ep = std::make_unique<route::MetricsEndpoint>(&reg);
    auto p = ep->start("0.0.0.0", c.metrics_port);
    if (!p.ok()) return fail(p.status());
    std::fprintf(stderr, "ferry: agent metrics on port %d\n", *p);
  }
  auto s = route::run_agent(split, router, c.agent, &reg);
  if (!s.ok()) return fail(s.status());
  std::printf("%s\n", s->to_json().dump(1).c_str());
  return s->accounted() ? 0 : 1;
}

void register_route_agent(CLI::App& app, CommandFn& run) {
  auto c = std::make_shared<AgentConfig>();
  route::AgentOptions& a = c->agent;
  auto* cmd = route_cmd(app)->add_subcommand("agent", "edge agent: route frames to a server");
  cmd->add_option("--server", a.server_url, "server URL, http://host:port")
      ->envname("FERRY_ROUTE_SERVER");
  cmd->add_option("--model", a.model, "model name on the server");
  cmd->add_option("--client", a.client, "client id reported to the server");
  cmd->add_option("--rho", c->rho, "offload budget in [0, 1], or 'auto' (server's published rho)");
  cmd->add_option("--deadline-ms", a.deadline_ms, "offload deadline from frame arrival")
      ->check(CLI::Range(0.1, 1e6));
  cmd->add_option("--fps", a.fps, "frame rate (0 = as fast as possible)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--frames", a.frames, "frames to stream (0 = whole split)")
      ->check(CLI::Range(0, 100000000));
  cmd->add_option("--concurrency", a.concurrency, "offload requests in flight")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--weak-ms", a.weak_ms, "emulated weak detector time per frame")
      ->check(CLI::Range(0.0, 1e4));
  cmd->add_option("--frame-bytes", a.frame_bytes, "emulated upload bytes per offloaded frame")
      ->check(CLI::Range(0, 16 << 20));
  cmd->add_flag_function(
      "--json-upload", [&a](std::int64_t) { a.binary_upload = false; },
      "send the pixels as KServe JSON numbers instead of the binary tensor extension");
  cmd->add_option("--feedback-gain", a.feedback_gain, "controller gain (0 = auto)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--records", c->records, "records folder (default: synthetic generator)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--split", c->split, "split to stream: test | calib | all")
      ->check(CLI::IsMember({"test", "calib", "all"}));
  cmd->add_option("--router", c->router, "router JSON (default: tune on the calib split)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--synthetic-frames", c->synthetic_frames, "synthetic generator frames")
      ->check(CLI::Range(2, 1000000));
  cmd->add_option("--shift", c->shift, "synthetic test difficulty shift")
      ->check(CLI::Range(-1.0, 1.0));
  cmd->add_option("--seed", c->seed, "synthetic generator seed");
  cmd->add_option("--metrics-port", c->metrics_port, "serve Prometheus /metrics (0 = ephemeral)")
      ->check(CLI::Range(0, 65535));
  cmd->callback([&run, c] { run = [c] { return run_agent_cmd(*c); }; });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_route_agent);
}  // namespace ferry::app
