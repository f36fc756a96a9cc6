// SPDX-License-Identifier: Apache-2.0
// `ferry route wan`: the user-space WAN emulator (src/route/transport/wan_proxy.h) as a process,
// between `ferry route agent` and `ferry route serve`, for machines without tc netem:
//   ferry route wan --upstream-port 8000 --port 8001 --delay-ms 20 --uplink-mbps 20
// Prints "listening port=<P>" on stdout once bound; runs until SIGINT/SIGTERM (or --duration-s),
// then prints the bytes it carried.
#include <cstdio>

#include "apps/ferry/commands.h"
#include "route/transport/wan_proxy.h"

namespace ferry::app {
namespace {

struct WanConfig {
  route::WanProxyOptions proxy;
  std::string host = "127.0.0.1";
  int port = 0;
  double duration_s = 0;
};

int run_wan(const WanConfig& c) {
  route::WanProxy proxy(c.proxy);
  auto port = proxy.start(c.host, c.port);
  if (!port.ok()) return fail(port.status());
  install_stop_signals();
  std::printf("listening port=%d upstream=%s:%d delay_ms=%.1f/%.1f rate_mbps=%.1f/%.1f\n", *port,
              c.proxy.upstream_host.c_str(), c.proxy.upstream_port, c.proxy.uplink.delay_ms,
              c.proxy.downlink.delay_ms, c.proxy.uplink.rate_mbps, c.proxy.downlink.rate_mbps);
  std::fflush(stdout);
  wait_for_stop(c.duration_s);
  proxy.stop();
  const route::WanProxyStats s = proxy.stats();
  std::printf("connections=%lld bytes_up=%lld bytes_down=%lld\n",
              static_cast<long long>(s.connections), static_cast<long long>(s.bytes_up),
              static_cast<long long>(s.bytes_down));
  return 0;
}

void register_route_wan(CLI::App& app, CommandFn& run) {
  auto c = std::make_shared<WanConfig>();
  auto* cmd = route_cmd(app)->add_subcommand("wan", "user-space WAN emulator (TCP proxy)");
  cmd->add_option("--host", c->host, "IPv4 address to listen on");
  cmd->add_option("--port", c->port, "port (0 = ephemeral)")->check(CLI::Range(0, 65535));
  cmd->add_option("--upstream-host", c->proxy.upstream_host, "server host");
  cmd->add_option("--upstream-port", c->proxy.upstream_port, "server port")
      ->required()
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--delay-ms", c->proxy.uplink.delay_ms, "one-way delay, both ways")
      ->check(CLI::Range(0.0, 60000.0));
  cmd->add_option("--uplink-mbps", c->proxy.uplink.rate_mbps, "edge -> cloud rate (0 = unlimited)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--downlink-mbps", c->proxy.downlink.rate_mbps,
                  "cloud -> edge rate (0 = unlimited)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--duration-s", c->duration_s, "stop after this long (0 = until a signal)")
      ->check(CLI::Range(0.0, 1e7));
  cmd->callback([&run, c] {
    c->proxy.downlink.delay_ms = c->proxy.uplink.delay_ms;
    run = [c] { return run_wan(*c); };
  });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_route_wan);
}  // namespace ferry::app
