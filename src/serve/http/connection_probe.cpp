// SPDX-License-Identifier: Apache-2.0
#include "serve/http/connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>

namespace ferry::serve::http {
namespace {

// The numeric address and port of a socket address, as httplib writes them into a Request.
bool address_of(const sockaddr_storage& a, std::string& host, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    if (inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf) == nullptr) return false;
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf) == nullptr) return false;
    port = ntohs(in6->sin6_port);
  } else {
    return false;
  }
  host = buf;
  return true;
}

bool matches(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr,
             int remote_port) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage peer{}, self{};
  socklen_t pl = sizeof peer, sl = sizeof self;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) return false;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sl) != 0) return false;
  std::string ph, sh;
  int pp = -1, sp = -1;
  if (!address_of(peer, ph, pp) || !address_of(self, sh, sp)) return false;
  return pp == remote_port && sp == local_port && ph == remote_addr && sh == local_addr;
}

}  // namespace

ConnectionProbe ConnectionProbe::find(const std::string& local_addr, int local_port,
                                      const std::string& remote_addr, int remote_port) {
  ConnectionProbe probe;
  if (local_port <= 0 || remote_port <= 0) return probe;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return probe;
  const int own = dirfd(dir);
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    if (matches(static_cast<int>(fd), local_addr, local_port, remote_addr, remote_port)) {
      probe.fd_ = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return probe;
}

bool ConnectionProbe::peer_gone() const {
  if (fd_ < 0) return false;
  pollfd p{.fd = fd_, .events = POLLRDHUP, .revents = 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace ferry::serve::http
