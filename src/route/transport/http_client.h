// SPDX-License-Identifier: Apache-2.0
// A small blocking HTTP/1.1 client over cpp-httplib for the route agent, tests and tools: one
// keep-alive connection to one endpoint, with a per-request timeout. Transport failures become a
// Status (kUnavailable: cannot connect; kDeadlineExceeded: read/write timed out or the peer closed
// the connection mid-request; kIo otherwise); any HTTP status, 4xx/5xx included, is a reply.
// httplib stays out of this header (pimpl), so users need not compile it.
// Thread-safety: none; use one HttpClient per thread.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/result.h"

namespace ferry::route {

struct HttpEndpoint {
  std::string host;
  int port = 0;
};
// Accepts "http://host:port", "host:port"; rejects https and missing/invalid ports.
Result<HttpEndpoint> parse_http_url(const std::string& url);

struct HttpReply {
  int status = 0;
  std::string body;
  std::string content_type;
  std::string retry_after;                     // Retry-After header ("" when absent)
  std::string rho;                             // X-Ferry-Rho header ("" when absent)
  std::map<std::string, std::string> headers;  // all headers, names lower-cased (last wins)
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
};

class HttpClient {
 public:
  HttpClient(HttpEndpoint ep, double timeout_ms);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  void set_timeout_ms(double timeout_ms);  // connect, read and write each
  Result<HttpReply> get(const std::string& path);
  Result<HttpReply> post(const std::string& path, const std::string& body,
                         const std::string& content_type = "application/json",
                         const std::map<std::string, std::string>& headers = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::route
