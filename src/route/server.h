// SPDX-License-Identifier: Apache-2.0
// The route cloud server: serves one "strong detector" model over KServe v2 JSON/HTTP
// (transport/kserve.h) with dynamic batching and admission control (server_batcher.h), publishes
// the offload ratio ρ it can sustain, and exports Prometheus /metrics.
// The detector replays the strong detections of a RecordSet by frame id (records folder or the
// synthetic generator, the same frames the agent streams), after an emulated service time.
// Sustainable ρ = min(1, headroom·capacity / demand), floored to 0.01, where capacity is
// --capacity-fps (or the batcher's full-batch service rate) and demand is the sum of the
// stream_fps that clients reported in the last 5 s (infer parameters or metadata query
// ?client=&stream_fps=); 1 with no known demand. It is sent as header X-Ferry-Rho on every
// response, in the model metadata parameters and as the gauge ferry_route_server_sustainable_rho.
// Every malformed request gets a 4xx JSON {"error"}; handlers catch everything.
// Thread-safety: start/stop from one thread; requests are served on httplib's worker pool.
// Covered by tests/unit/route/server_test.cpp and tests/cli/route_e2e.sh.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "route/records.h"
#include "route/server_batcher.h"

namespace ferry::route {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = ephemeral
  std::string model = "strong";
  BatcherOptions batcher;
  double headroom = 0.9;  // fraction of capacity published as sustainable
  // HTTP worker threads; 0 = default_http_threads(batcher). cpp-httplib gives each open
  // connection a thread until it closes (a keep-alive connection idles up to 5 s), so this bounds
  // the client connections served at once; the others wait unread (gauge
  // ferry_route_server_http_connections{state="waiting"}).
  int threads = 0;
  bool trace = false;  // keep a RequestTrace per infer request (diagnosis; grows unbounded)
};
Status validate(const ServerOptions& o);
// max(64, 2·max_batch + 4): room for many agents' keep-alive connections plus full batches.
int default_http_threads(const BatcherOptions& b);

// One infer request's timeline (steady_clock nanoseconds since its epoch; 0 = did not happen).
// recv_ns is when the handler ran, i.e. after httplib read the whole request on a worker thread.
struct RequestTrace {
  std::string id;
  std::int64_t recv_ns = 0, batch_start_ns = 0, reply_ns = 0;
  int status = 0, batch_size = 0;
};

class DetectionServer {
 public:
  DetectionServer(ServerOptions opts, const RecordSet& records);
  ~DetectionServer();  // stops if running
  DetectionServer(const DetectionServer&) = delete;
  DetectionServer& operator=(const DetectionServer&) = delete;

  // Binds and starts serving on a background thread; returns the bound port.
  Result<int> start();
  void stop();
  double sustainable_rho() const;
  std::string metrics_text() const;
  std::vector<RequestTrace> trace() const;  // empty unless ServerOptions::trace

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::route
