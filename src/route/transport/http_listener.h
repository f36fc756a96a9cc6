// SPDX-License-Identifier: Apache-2.0
// A bound httplib::Server listening on its own thread, with a start/stop that cannot race.
//
// Why: httplib's Server::stop() only closes the socket once the listener thread has set its
// running flag. A stop() issued before that (a server created and destroyed at once, or a start
// that fails right after binding) is silently ignored and the listener then blocks in accept()
// forever, hanging the join. HttpListener::start returns only after the listener runs (or has
// already exited), so stop() always takes effect.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "core/result.h"

namespace httplib {
class Server;
}

namespace ferry::route {

class HttpListener {
 public:
  explicit HttpListener(httplib::Server& http, std::string name);
  ~HttpListener();
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  // Binds host:port (port 0: any free port) and starts listening; returns the bound port.
  Result<int> start(const std::string& host, int port);
  // Idempotent; returns once the listener thread has exited.
  void stop();
  bool running() const { return thread_.joinable(); }

 private:
  httplib::Server& http_;
  std::string name_;
  std::thread thread_;
  std::shared_ptr<std::atomic<bool>> exited_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace ferry::route
