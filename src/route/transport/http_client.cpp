// SPDX-License-Identifier: Apache-2.0
// HttpClient over httplib::Client (see http_client.h). Exceptions from httplib or std are caught
// here and turned into a Status (nothing escapes src/).
#include "route/transport/http_client.h"

#include <cctype>
#include <cmath>
#include <exception>

#include <httplib.h>

namespace ferry::route {

Result<HttpEndpoint> parse_http_url(const std::string& url) {
  std::string s = url;
  if (s.rfind("https://", 0) == 0)
    return invalid_argument("route: https is not supported: {}", url);
  if (s.rfind("http://", 0) == 0) s = s.substr(7);
  while (!s.empty() && s.back() == '/') s.pop_back();
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || s.find('/') != std::string::npos)
    return invalid_argument("route: expected http://host:port, got '{}'", url);
  HttpEndpoint ep;
  ep.host = s.substr(0, colon);
  const std::string p = s.substr(colon + 1);
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos)
    return invalid_argument("route: bad port in '{}'", url);
  ep.port = std::stoi(p);
  if (ep.port <= 0 || ep.port > 65535) return invalid_argument("route: bad port in '{}'", url);
  return ep;
}

struct HttpClient::Impl {
  HttpEndpoint ep;
  httplib::Client cli;
  Impl(const HttpEndpoint& e) : ep(e), cli(e.host, e.port) {}
};

HttpClient::HttpClient(HttpEndpoint ep, double timeout_ms) : impl_(std::make_unique<Impl>(ep)) {
  impl_->cli.set_keep_alive(true);
  // Requests go out as header + body writes; with Nagle on, the body waits for the server's
  // delayed ACK (~40 ms on Linux) and every offload pays it.
  impl_->cli.set_tcp_nodelay(true);
  set_timeout_ms(timeout_ms);
}

HttpClient::~HttpClient() = default;

void HttpClient::set_timeout_ms(double timeout_ms) {
  const auto us = static_cast<long long>(std::max(1.0, timeout_ms * 1000.0));
  const time_t sec = static_cast<time_t>(us / 1000000);
  const time_t usec = static_cast<time_t>(us % 1000000);
  impl_->cli.set_connection_timeout(sec, usec);
  impl_->cli.set_read_timeout(sec, usec);
  impl_->cli.set_write_timeout(sec, usec);
}

namespace {

Result<HttpReply> to_reply(httplib::Result&& r, const HttpEndpoint& ep, const std::string& path) {
  if (!r) {
    const httplib::Error e = r.error();
    const std::string what = httplib::to_string(e);
    if (e == httplib::Error::Connection || e == httplib::Error::ConnectionTimeout)
      return unavailable("route: cannot reach {}:{}{}: {}", ep.host, ep.port, path, what);
    if (e == httplib::Error::Read || e == httplib::Error::Write)
      return deadline_exceeded("route: {}:{}{}: {} (timeout or connection closed)", ep.host,
                               ep.port, path, what);
    return io_error("route: {}:{}{}: {}", ep.host, ep.port, path, what);
  }
  HttpReply rep;
  rep.status = r->status;
  rep.body = r->body;
  rep.content_type = r->get_header_value("Content-Type");
  rep.retry_after = r->get_header_value("Retry-After");
  rep.rho = r->get_header_value("X-Ferry-Rho");
  for (const auto& [k, v] : r->headers) {
    std::string lower = k;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    rep.headers[lower] = v;
  }
  return rep;
}

}  // namespace

Result<HttpReply> HttpClient::get(const std::string& path) {
  try {
    return to_reply(impl_->cli.Get(path), impl_->ep, path);
  } catch (const std::exception& e) {
    return internal_error("route: GET {}: {}", path, e.what());
  }
}

Result<HttpReply> HttpClient::post(const std::string& path, const std::string& body,
                                   const std::string& content_type,
                                   const std::map<std::string, std::string>& headers) {
  try {
    httplib::Headers h(headers.begin(), headers.end());
    return to_reply(impl_->cli.Post(path, h, body, content_type), impl_->ep, path);
  } catch (const std::exception& e) {
    return internal_error("route: POST {}: {}", path, e.what());
  }
}

}  // namespace ferry::route
