// SPDX-License-Identifier: Apache-2.0
#include "serve/routing_trace.h"

#include <fmt/format.h>

#include <sstream>

#include "core/file_util.h"

namespace ferry::serve {

std::string RoutingTrace::to_text() const {
  std::string out = fmt::format("ferry-routing-trace 1\nexperts {} top_k {}\n", experts, top_k);
  for (const auto& [k, ids] : routes) {
    out += fmt::format("{} {} {}", k.request, k.position, k.layer);
    for (std::int32_t e : ids) out += fmt::format(" {}", e);
    out += '\n';
  }
  return out;
}

Status RoutingTrace::save(const std::string& path) const {
  return write_file_atomic(path, to_text());
}

Result<RoutingTrace> RoutingTrace::parse(std::string_view text, std::string_view what) {
  RoutingTrace t;
  std::istringstream in{std::string(text)};
  std::string line;
  int lineno = 0, header = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    if (header == 0) {
      std::string magic;
      int version = 0;
      if (!(ls >> magic >> version) || magic != "ferry-routing-trace" || version != 1) {
        return invalid_argument("serve: {}:{}: not a ferry routing trace (version 1)", what,
                                lineno);
      }
      ++header;
      continue;
    }
    if (header == 1) {
      std::string a, b;
      if (!(ls >> a >> t.experts >> b >> t.top_k) || a != "experts" || b != "top_k" ||
          t.experts <= 0 || t.top_k <= 0 || t.top_k > t.experts) {
        return invalid_argument("serve: {}:{}: expected 'experts E top_k K'", what, lineno);
      }
      ++header;
      continue;
    }
    RouteKey key;
    std::vector<std::int32_t> ids(t.top_k);
    if (!(ls >> key.request >> key.position >> key.layer)) {
      return invalid_argument("serve: {}:{}: expected 'request position layer experts...'", what,
                              lineno);
    }
    for (auto& e : ids) {
      if (!(ls >> e) || e < 0 || e >= t.experts) {
        return invalid_argument("serve: {}:{}: need {} expert ids in [0, {})", what, lineno,
                                t.top_k, t.experts);
      }
    }
    std::string extra;
    if (ls >> extra) return invalid_argument("serve: {}:{}: trailing '{}'", what, lineno, extra);
    for (int i = 0; i < t.top_k; ++i) {
      for (int j = 0; j < i; ++j) {
        if (ids[i] == ids[j]) {
          return invalid_argument("serve: {}:{}: expert {} repeated", what, lineno, ids[i]);
        }
      }
    }
    t.routes[key] = std::move(ids);
  }
  if (header < 2) return invalid_argument("serve: {}: missing trace header", what);
  return t;
}

Result<RoutingTrace> RoutingTrace::load(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  return parse(text, path);
}

Status TraceRecorder::on_route(const RouteKey& key, std::span<std::int32_t> ids) {
  trace_.routes[key].assign(ids.begin(), ids.end());
  return ok_status();
}

Result<bool> TraceReplayer::forced_route(const RouteKey& key, std::span<std::int32_t> ids) {
  if (static_cast<int>(ids.size()) != trace_.top_k) {
    return invalid_argument("serve: trace has top_k {}, the model routes to {}", trace_.top_k,
                            ids.size());
  }
  const auto it = trace_.routes.find(key);
  if (it == trace_.routes.end()) {
    if (!strict_) return false;
    return not_found("serve: routing trace has no entry for request {} position {} layer {}",
                     key.request, key.position, key.layer);
  }
  std::copy(it->second.begin(), it->second.end(), ids.begin());
  ++forced_;
  return true;
}

Status TraceReplayer::on_route(const RouteKey& key, std::span<std::int32_t> ids) {
  return forced_route(key, ids).status();
}

}  // namespace ferry::serve
