// SPDX-License-Identifier: Apache-2.0
// User-space WAN emulator (see wan_proxy.h). One accept thread; per connection and direction a
// reader thread (stamps each chunk with its departure time) and a writer thread (sleeps until
// then and writes), so a slow direction never stalls the other.
#include "route/transport/wan_proxy.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "core/log.h"

namespace ferry::route {
namespace {

using Clock = std::chrono::steady_clock;

std::int64_t ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Collects WanTraceEvents from every pipe when tracing is on.
class TraceSink {
 public:
  void add(WanTraceEvent e) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
  }
  std::vector<WanTraceEvent> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<WanTraceEvent> events_;
};

struct Chunk {
  Clock::time_point in, out;
  std::vector<char> bytes;  // empty = end of stream
};

// The serialiser of one direction of the link, shared by every connection: a modelled uplink has
// one rate, however many TCP connections cross it. Reservations are handed out in arrival order,
// so each connection's chunks also leave in order.
class LinkClock {
 public:
  explicit LinkClock(double rate_mbps) : rate_mbps_(rate_mbps) {}
  // Serialises `bytes` arriving at `now`; returns when the last bit is on the wire.
  Clock::time_point reserve(Clock::time_point now, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto start = std::max(now, tx_end_);
    const double tx_s = rate_mbps_ > 0 ? bytes * 8.0 / (rate_mbps_ * 1e6) : 0.0;
    tx_end_ =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(tx_s));
    return tx_end_;
  }

 private:
  const double rate_mbps_;
  std::mutex mu_;
  Clock::time_point tx_end_{};
};

// One direction of one connection: chunks from `from` cross the shared link to `to`.
class Pipe {
 public:
  Pipe(int from, int to, WanLink link, LinkClock* clock, std::atomic<std::int64_t>* counter,
       TraceSink* trace, int conn, char kind)
      : from_(from),
        to_(to),
        link_(link),
        clock_(clock),
        counter_(counter),
        trace_(trace),
        conn_(conn),
        kind_(kind) {}
  void start() {
    reader_ = std::thread([this] { read_loop(); });
    writer_ = std::thread([this] { write_loop(); });
  }
  void join() {
    if (reader_.joinable()) reader_.join();
    if (writer_.joinable()) writer_.join();
  }
  // Both threads have returned (their join will not block).
  bool finished() const { return done_.load() == 2; }
  void abort() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborted_ = true;
    }
    cv_.notify_all();
  }

 private:
  void read_loop() {
    read_body();
    ++done_;
  }
  void write_loop() {
    write_body();
    ++done_;
  }
  void read_body() {
    std::vector<char> buf(64 * 1024);
    Clock::time_point tx_end = Clock::now();
    for (;;) {
      const ssize_t n = ::recv(from_, buf.data(), buf.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      Chunk c;
      const auto now = Clock::now();
      c.in = now;
      if (n > 0) {
        c.bytes.assign(buf.begin(), buf.begin() + n);
        tx_end = clock_->reserve(now, static_cast<std::size_t>(n));
        counter_->fetch_add(n);
      } else {
        tx_end = std::max(now, tx_end);  // EOF or error: close after what is queued
      }
      c.out = tx_end + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double, std::milli>(link_.delay_ms));
      const bool eof = n <= 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(c));
      }
      cv_.notify_all();
      if (eof) return;
    }
  }
  void write_body() {
    for (;;) {
      Chunk c;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return aborted_ || !queue_.empty(); });
        if (aborted_) return;
        const auto out = queue_.front().out;
        if (cv_.wait_until(lock, out, [&] { return aborted_; })) return;
        c = std::move(queue_.front());
        queue_.pop_front();
      }
      if (c.bytes.empty()) {
        ::shutdown(to_, SHUT_WR);  // pass the half-close on
        return;
      }
      std::size_t off = 0;
      while (off < c.bytes.size()) {
        const ssize_t n = ::send(to_, c.bytes.data() + off, c.bytes.size() - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          ::shutdown(from_, SHUT_RD);  // the peer is gone: stop reading this direction too
          return;
        }
        off += static_cast<std::size_t>(n);
      }
      if (trace_) {
        trace_->add(
            {conn_, kind_, static_cast<std::int64_t>(c.bytes.size()), ns(c.in), ns(Clock::now())});
      }
    }
  }

  int from_, to_;
  WanLink link_;
  LinkClock* clock_;
  std::atomic<std::int64_t>* counter_;
  TraceSink* trace_;  // null = not tracing
  int conn_;
  char kind_;
  std::thread reader_, writer_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk> queue_;
  bool aborted_ = false;
  std::atomic<int> done_{0};
};

struct Connection {
  int client = -1, upstream = -1;
  std::unique_ptr<Pipe> up, down;
};

int connect_to(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  return fd;
}

void no_delay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

Status validate(const WanProxyOptions& o) {
  if (o.upstream_port <= 0 || o.upstream_port > 65535) {
    return invalid_argument("wan proxy: upstream port {} out of range", o.upstream_port);
  }
  for (const WanLink* l : {&o.uplink, &o.downlink}) {
    if (!(l->delay_ms >= 0 && l->delay_ms <= 60000)) {
      return invalid_argument("wan proxy: delay_ms must be in [0, 60000] ({})", l->delay_ms);
    }
    if (!(l->rate_mbps >= 0 && l->rate_mbps <= 1e6)) {
      return invalid_argument("wan proxy: rate_mbps must be in [0, 1e6] ({})", l->rate_mbps);
    }
  }
  return ok_status();
}

struct WanProxy::Impl {
  WanProxyOptions opts;
  int listen_fd = -1;
  std::thread acceptor;
  std::mutex mu;
  std::list<Connection> conns;
  bool stopping = false;
  std::atomic<std::int64_t> connections{0}, bytes_up{0}, bytes_down{0};
  std::unique_ptr<LinkClock> up_clock_ptr, down_clock_ptr;
  TraceSink trace;

  // Joins and closes connections whose both directions have ended (caller holds mu), so a
  // long-running proxy does not keep threads and descriptors of closed connections.
  void reap_finished() {
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->up->finished() && it->down->finished()) {
        it->up->join();
        it->down->join();
        ::close(it->client);
        ::close(it->upstream);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }

  void accept_loop() {
    for (;;) {
      const int c = ::accept(listen_fd, nullptr, nullptr);
      if (c < 0) {
        if (errno == EINTR) continue;
        return;  // listener closed by stop()
      }
      const auto accepted = Clock::now();
      const int u = connect_to(opts.upstream_host, opts.upstream_port);
      if (u < 0) {  // upstream down: refuse this client the way the server itself would
        ::close(c);
        continue;
      }
      no_delay(c);
      no_delay(u);
      std::lock_guard<std::mutex> lock(mu);
      reap_finished();
      if (stopping) {
        ::close(c);
        ::close(u);
        return;
      }
      const int id = static_cast<int>(connections++);
      TraceSink* sink = opts.trace ? &trace : nullptr;
      if (sink) sink->add({id, 'a', 0, ns(accepted), ns(Clock::now())});
      Connection& k = conns.emplace_back();
      k.client = c;
      k.upstream = u;
      k.up =
          std::make_unique<Pipe>(c, u, opts.uplink, up_clock_ptr.get(), &bytes_up, sink, id, 'u');
      k.down = std::make_unique<Pipe>(u, c, opts.downlink, down_clock_ptr.get(), &bytes_down, sink,
                                      id, 'd');
      k.up->start();
      k.down->start();
    }
  }
};

WanProxy::WanProxy(WanProxyOptions o) : impl_(std::make_unique<Impl>()) {
  impl_->opts = std::move(o);
}

WanProxy::~WanProxy() { stop(); }

Result<int> WanProxy::start(const std::string& host, int port) {
  Impl& m = *impl_;
  FERRY_TRY(validate(m.opts));
  if (m.listen_fd >= 0) return invalid_argument("wan proxy: already running");
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return io_error("wan proxy: socket: {}", std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    return invalid_argument("wan proxy: listen host must be an IPv4 address ({})", host);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 128) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return unavailable("wan proxy: cannot listen on {}:{}: {}", host, port, why);
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  m.listen_fd = fd;
  m.stopping = false;
  m.up_clock_ptr = std::make_unique<LinkClock>(m.opts.uplink.rate_mbps);
  m.down_clock_ptr = std::make_unique<LinkClock>(m.opts.downlink.rate_mbps);
  m.acceptor = std::thread([&m] { m.accept_loop(); });
  return static_cast<int>(ntohs(addr.sin_port));
}

void WanProxy::stop() {
  Impl& m = *impl_;
  if (m.listen_fd < 0) return;
  ::shutdown(m.listen_fd, SHUT_RDWR);  // wakes accept()
  if (m.acceptor.joinable()) m.acceptor.join();
  ::close(m.listen_fd);
  m.listen_fd = -1;
  std::list<Connection> conns;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopping = true;
    conns.swap(m.conns);
  }
  for (Connection& k : conns) {
    ::shutdown(k.client, SHUT_RDWR);
    ::shutdown(k.upstream, SHUT_RDWR);
    k.up->abort();
    k.down->abort();
  }
  for (Connection& k : conns) {
    k.up->join();
    k.down->join();
    ::close(k.client);
    ::close(k.upstream);
  }
}

std::vector<WanTraceEvent> WanProxy::trace() const { return impl_->trace.events(); }

WanProxyStats WanProxy::stats() const {
  return {impl_->connections.load(), impl_->bytes_up.load(), impl_->bytes_down.load()};
}

}  // namespace ferry::route
