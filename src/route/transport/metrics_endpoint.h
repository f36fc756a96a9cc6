// SPDX-License-Identifier: Apache-2.0
// A minimal HTTP endpoint serving GET /metrics (Prometheus text) from a PromRegistry, for the
// route edge agent (the server has its own routes). httplib stays out of this header.
// Thread-safety: start/stop from one thread; the registry must outlive the endpoint.
#pragma once

#include <memory>
#include <string>

#include "core/result.h"
#include "route/metrics_prom.h"

namespace ferry::route {

class MetricsEndpoint {
 public:
  explicit MetricsEndpoint(const PromRegistry* registry);
  ~MetricsEndpoint();  // stops
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;
  Result<int> start(const std::string& host, int port);  // port 0 = ephemeral; returns bound port
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::route
