// SPDX-License-Identifier: Apache-2.0
// `ferry route serve`: the cloud detection server (src/route/server.h) as a process. It replays
// the strong detections of a records folder, or of the synthetic generator with the same
// --synthetic-frames/--seed/--shift as the agent, over KServe v2 JSON/HTTP until SIGINT/SIGTERM.
// Prints "listening port=<P>" on stdout once bound (useful with --port 0).
#include <atomic>
#include <cstdio>

#include "apps/ferry/commands.h"
#include "route/server.h"
#include "route/synthetic.h"

namespace ferry::app {
namespace {

struct ServeConfig {
  route::ServerOptions server;
  std::string records;
  int synthetic_frames = 1000;
  double shift = 0.1;
  std::uint64_t seed = 1;
  double duration_s = 0;
};

int run_serve(ServeConfig c) {
  route::RecordSet rs;
  if (!c.records.empty()) {
    auto r = route::load_records(c.records);
    if (!r.ok()) return fail(r.status());
    rs = std::move(*r);
  } else {
    route::SyntheticOptions so;
    so.frames = c.synthetic_frames;
    so.test_shift = c.shift;
    so.seed = c.seed;
    rs = route::make_synthetic_records(so);
  }
  if (Status s = route::validate(c.server); !s.ok()) return fail(s);
  route::DetectionServer server(c.server, rs);
  auto port = server.start();
  if (!port.ok()) return fail(port.status());
  install_stop_signals();
  std::printf("listening port=%d model=%s frames=%zu\n", *port, c.server.model.c_str(),
              rs.frames.size());
  std::fflush(stdout);
  wait_for_stop(c.duration_s);
  server.stop();
  return 0;
}

void register_route_serve(CLI::App& app, CommandFn& run) {
  auto c = std::make_shared<ServeConfig>();
  auto* cmd = route_cmd(app)->add_subcommand("serve", "cloud detection server (KServe v2 JSON)");
  route::BatcherOptions& b = c->server.batcher;
  cmd->add_option("--host", c->server.host, "address to bind")->envname("FERRY_ROUTE_HOST");
  cmd->add_option("--port", c->server.port, "port (0 = ephemeral)")
      ->check(CLI::Range(0, 65535))
      ->envname("FERRY_ROUTE_PORT");
  cmd->add_option("--model", c->server.model, "model name served");
  cmd->add_option(
         "--threads", c->server.threads,
         "HTTP worker threads = client connections served at once (0 = max(64, 2*max-batch+4))")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--max-batch", b.max_batch, "largest batch")->check(CLI::Range(1, 1024));
  cmd->add_option("--batch-timeout-ms", b.batch_timeout_ms, "wait for a batch to fill")
      ->check(CLI::Range(0.0, 1e4));
  cmd->add_option("--max-queue", b.max_queue, "admitted, unfinished requests before 503")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--capacity-fps", b.capacity_fps, "admission rate limit (0 = none)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--batch-base-ms", b.batch_base_ms, "emulated detector time per batch")
      ->check(CLI::Range(0.0, 1e4));
  cmd->add_option("--per-frame-ms", b.per_frame_ms, "emulated detector time per frame")
      ->check(CLI::Range(0.0, 1e4));
  cmd->add_option("--headroom", c->server.headroom, "fraction of capacity published as rho")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--records", c->records, "records folder to replay (default: synthetic)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--synthetic-frames", c->synthetic_frames, "synthetic generator frames")
      ->check(CLI::Range(2, 1000000));
  cmd->add_option("--shift", c->shift, "synthetic test difficulty shift")
      ->check(CLI::Range(-1.0, 1.0));
  cmd->add_option("--seed", c->seed, "synthetic generator seed");
  cmd->add_option("--duration-s", c->duration_s, "stop after this long (0 = until a signal)")
      ->check(CLI::Range(0.0, 1e7));
  cmd->callback([&run, c] { run = [c] { return run_serve(*c); }; });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_route_serve);
}  // namespace ferry::app
