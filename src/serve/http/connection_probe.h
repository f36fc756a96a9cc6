// SPDX-License-Identifier: Apache-2.0
// ConnectionProbe: whether the client of a request being handled is still connected, so a
// non-streamed completion whose client went away is cancelled in the engine instead of running
// to its end (streamed ones notice at their next write). cpp-httplib 0.11 (Debian bookworm)
// gives a handler no socket, so the probe finds the handler's connection among the process's
// open sockets by its address pair — local address and port, remote address and port, which
// identify one TCP connection — once, and then polls that descriptor: POLLRDHUP, POLLHUP or
// POLLERR mean the peer closed or reset its side. The descriptor stays open while the handler
// runs (httplib closes it after the handler returns), so it cannot be reused under the probe.
// A client that half-closes its sending side while it waits reads as gone (as in uvicorn).
//   ConnectionProbe probe = ConnectionProbe::find(req.local_addr, req.local_port,
//                                                  req.remote_addr, req.remote_port);
//   if (probe.peer_gone()) cancel();
#pragma once

#include <string>

namespace ferry::serve::http {

class ConnectionProbe {
 public:
  // Linux: scans /proc/self/fd. Not found (another platform, a non-TCP transport): found() is
  // false and peer_gone() always false (the request then runs to its end).
  static ConnectionProbe find(const std::string& local_addr, int local_port,
                              const std::string& remote_addr, int remote_port);
  bool found() const { return fd_ >= 0; }
  bool peer_gone() const;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace ferry::serve::http
