// SPDX-License-Identifier: Apache-2.0
// GET /metrics over httplib for the edge agent (see metrics_endpoint.h).
#include "route/transport/metrics_endpoint.h"

#include <exception>

#include <httplib.h>

#include "route/transport/http_listener.h"

namespace ferry::route {

struct MetricsEndpoint::Impl {
  const PromRegistry* reg;
  httplib::Server http;
  HttpListener listener{http, "metrics endpoint"};
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
  return impl_->listener.start(host, port);
}

void MetricsEndpoint::stop() { impl_->listener.stop(); }

}  // namespace ferry::route
