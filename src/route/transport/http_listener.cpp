// SPDX-License-Identifier: Apache-2.0
// See http_listener.h for why start waits for the listener thread.
#include "route/transport/http_listener.h"

#include <chrono>
#include <exception>

#include <httplib.h>

#include "core/log.h"

namespace ferry::route {

HttpListener::HttpListener(httplib::Server& http, std::string name)
    : http_(http), name_(std::move(name)) {}

HttpListener::~HttpListener() { stop(); }

Result<int> HttpListener::start(const std::string& host, int port) {
  if (running()) return invalid_argument("{}: already running", name_);
  const int bound =
      port == 0 ? http_.bind_to_any_port(host) : (http_.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) return unavailable("{}: cannot bind {}:{}", name_, host, port);
  exited_->store(false);
  thread_ = std::thread([this, exited = exited_] {
    try {
      http_.listen_after_bind();
    } catch (const std::exception& e) {
      log::get("router")->error("{}: listener stopped: {}", name_, e.what());
    }
    exited->store(true);
  });
  // Wait until stop() can reach the listener (see the header). Bounded: a listener that neither
  // runs nor exits within 10 s is a broken environment, reported rather than hung on.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!http_.is_running() && !exited_->load()) {
    if (std::chrono::steady_clock::now() > deadline) {
      thread_.detach();
      return unavailable("{}: listener on {}:{} did not start within 10 s", name_, host, bound);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (exited_->load()) {
    thread_.join();
    return unavailable("{}: listener on {}:{} exited at once", name_, host, bound);
  }
  return bound;
}

void HttpListener::stop() {
  if (!running()) return;
  // The listener runs (start saw it), so stop() closes its socket and the accept loop ends.
  // Once only: a second httplib stop() on a closed socket trips an assertion in the library.
  http_.stop();
  thread_.join();
}

}  // namespace ferry::route
