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

#include <memory>
#include <string>

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
  int threads = 0;        // HTTP worker threads; 0 = max(8, 2·max_batch + 4)
};
Status validate(const ServerOptions& o);

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

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::route
