// SPDX-License-Identifier: Apache-2.0
// A user-space WAN emulator: a TCP proxy that forwards each connection to an upstream server
// through a modelled link per direction — a FIFO queue, serialisation at `rate_mbps`, then a fixed
// one-way `delay_ms` (propagation). A chunk read at time t leaves at
//   tx_start = max(t, previous tx_end);  tx_end = tx_start + bytes·8 / rate;  out = tx_end + delay,
// so RTT = 2·delay for small messages and large uploads pay their serialisation time, as over a
// real uplink. The serialiser of each direction is shared by all connections (one link, one rate).
// It runs without root or sch_netem (which CI and containers often lack), so the edge agent and
// cloud server can be tested and benchmarked over an emulated WAN anywhere;
// tests/cli/route_netns.sh uses tc netem between namespaces where it is available.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"

namespace ferry::route {

struct WanLink {
  double delay_ms = 20;  // one way
  double rate_mbps = 0;  // 0 = unlimited
};

struct WanProxyOptions {
  std::string upstream_host = "127.0.0.1";
  int upstream_port = 0;
  WanLink uplink;      // client -> upstream (the edge's upload)
  WanLink downlink;    // upstream -> client
  bool trace = false;  // keep a WanTraceEvent per accepted connection and chunk (diagnosis)
};
Status validate(const WanProxyOptions& o);

struct WanProxyStats {
  std::int64_t connections = 0;
  std::int64_t bytes_up = 0, bytes_down = 0;
};

// steady_clock nanoseconds since its epoch, so traces line up with the agent's and the server's.
struct WanTraceEvent {
  int conn = 0;
  char kind = 'a';  // 'a' accepted (upstream connected), 'u' uplink chunk, 'd' downlink chunk
  std::int64_t bytes = 0;
  std::int64_t in_ns = 0;       // read from the sender (accept time for 'a')
  std::int64_t written_ns = 0;  // written to the receiver (upstream connected for 'a')
};

class WanProxy {
 public:
  explicit WanProxy(WanProxyOptions o);
  ~WanProxy();
  WanProxy(const WanProxy&) = delete;
  WanProxy& operator=(const WanProxy&) = delete;

  // Listens on host:port (0 = any free port); returns the bound port.
  Result<int> start(const std::string& host, int port);
  // Closes the listener and every open connection; idempotent.
  void stop();
  WanProxyStats stats() const;
  std::vector<WanTraceEvent> trace() const;  // empty unless WanProxyOptions::trace

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::route
