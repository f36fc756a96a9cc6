// SPDX-License-Identifier: Apache-2.0
// GET /metrics over httplib for the edge agent (see metrics_endpoint.h).
#include "route/transport/metrics_endpoint.h"

#include <exception>
#include <thread>

#include <httplib.h>

namespace ferry::route {

struct MetricsEndpoint::Impl {
  const PromRegistry* reg;
  httplib::Server http;
  std::thread thread;
  bool running = false;
};

MetricsEndpoint::MetricsEndpoint(const PromRegistry* registry) : impl_(std::make_unique<Impl>()) {
  impl_->reg = registry;
  impl_->http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    try {
      res.set_content(impl_->reg->render(), "text/plain; version=0.0.4");
    } catch (const std::exception& e) {
      res.status = 500;
      res.set_content(std::string("{\"error\":\"metrics: ") + e.what() + "\"}", "application/json");
    }
  });
}

MetricsEndpoint::~MetricsEndpoint() { stop(); }

Result<int> MetricsEndpoint::start(const std::string& host, int port) {
  Impl& m = *impl_;
  if (m.running) return invalid_argument("metrics endpoint: already running");
  const int bound =
      port == 0 ? m.http.bind_to_any_port(host) : (m.http.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) return unavailable("metrics endpoint: cannot bind {}:{}", host, port);
  m.thread = std::thread([&m] {
    try {
      m.http.listen_after_bind();
    } catch (...) {
    }
  });
  m.running = true;
  return bound;
}

void MetricsEndpoint::stop() {
  Impl& m = *impl_;
  if (!m.running) return;
  m.http.stop();
  if (m.thread.joinable()) m.thread.join();
  m.running = false;
}

}  // namespace ferry::route
